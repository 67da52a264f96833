"""The buffer's transforms, as TorchRL's replay buffers keep them: a ``Compose``, applied
forward to every sampled batch and inverted on the way in (``extend``); the buffer's
``append_transform`` / ``insert_transform`` (:class:`TransformsMixin`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torchrl.envs.transforms.transforms import (
    Compose,
    Transform,
    _CallableTransform,
    _InvertTransform,
)


def prepared(transform: Transform | Callable[..., Any], invert: bool) -> Transform:
    """A buffer's transform as TorchRL's ``append_transform`` makes it: a callable wrapped,
    ``invert`` swapping its directions, in eval mode."""
    if not isinstance(transform, Transform):
        if not callable(transform):
            raise TypeError(
                f"a transform must be a TorchRL Transform or a callable, got {transform!r}"
            )
        transform = _CallableTransform(transform)
    if invert:
        transform = _InvertTransform(transform)
    transform.eval()
    return transform


def as_compose(transform: Transform | Callable[..., Any] | None) -> Compose:
    """The buffer's transforms, in order, from ``transform=`` (nothing, one, or a Compose)."""
    if transform is None:
        return Compose()
    if isinstance(transform, Compose):
        return transform
    return Compose(prepared(transform, invert=False))


Self = TypeVar("Self", bound="TransformsMixin")


class TransformsMixin:
    """``append_transform`` and ``insert_transform`` of :class:`~.buffer.TDReplayBuffer`."""

    _transform: Compose

    def append_transform(
        self: Self, transform: Transform | Callable[..., Any], *, invert: bool = False
    ) -> Self:
        """Apply ``transform`` last to every sampled batch, as TorchRL's buffers do
        (``invert=True``: its forward on the way in, at ``extend``, its inverse on the way out).

        Example:
            >>> rb.append_transform(lambda td: td.set("reward2", td["next", "reward"] * 2))  # doctest: +SKIP
        """
        self._transform.append(prepared(transform, invert))
        return self

    def insert_transform(
        self: Self, index: int, transform: Transform | Callable[..., Any], *, invert: bool = False
    ) -> Self:
        """Insert ``transform`` at ``index`` of the buffer's transforms (see :meth:`append_transform`)."""
        self._transform.insert(index, prepared(transform, invert))
        return self
