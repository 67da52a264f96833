"""The buffer's transforms, as TorchRL's replay buffers keep them: a ``Compose``, applied
forward to every sampled batch and inverted on the way in (``extend``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
