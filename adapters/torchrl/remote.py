"""What TorchRL sees where an in-process buffer keeps its storage, sampler and writer.

TorchRL's collectors look inside the buffer they are given: a multi-process
collector reads ``replay_buffer._storage.initialized`` (and would otherwise
write a fake batch to lay out a lazy storage, then ``empty()`` it), checks
``isinstance(replay_buffer._sampler, SliceSampler)`` and aligns devices
through ``replay_buffer._storage.device``. A :class:`TDReplayBuffer` has no
local storage: its table lives in the server. These markers answer those
probes truthfully — laid out already (the table's schema fixed it), no
device to move rows to — and name the table they stand for. They are not
:class:`torchrl.data.Storage` / ``Sampler`` / ``Writer`` subclasses: nothing
in this process stores, samples or writes rows, so nothing may treat them as
if it could.

    >>> ServiceStorage("cartpole").initialized
    True
    >>> ServiceSampler("cartpole", "prioritized").prioritized
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tdreplay.codec.protocol import CONSUMING


@dataclass(frozen=True)
class ServiceStorage:
    """Stands for a table's storage, held by the server.

    Attributes:
        table: the table's name.
        initialized: always ``True``: the schema lays the table out before any write.
        device: ``None``: rows go to the server as they are; no local device to align to.
        is_remote: always ``True`` (the flag TorchRL's Ray helpers set on remote classes).
    """

    table: str
    initialized: bool = True
    device: Any = None
    is_remote: bool = True
    shared_init: bool = False


@dataclass(frozen=True)
class ServiceSampler:
    """Stands for a table's sampler, run by the server.

    Attributes:
        table: the table's name.
        kind: the server's sampler (``uniform``, ``prioritized``, ``fifo``, ``slice``...).
        options: the sampler's settings as the table's info lists them (alpha, beta...).
    """

    table: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    is_remote: bool = True

    @property
    def prioritized(self) -> bool:
        """Whether the table keeps priorities (``update_priority`` applies)."""
        return self.kind == "prioritized"

    @property
    def epochs(self) -> bool:
        """Whether it draws in epochs, every item once before any repeats (TorchRL's
        ``SamplerWithoutReplacement``: iteration ends with the epoch)."""
        return self.kind == "without_replacement"

    @property
    def consuming(self) -> bool:
        """Whether each item is sampled once (iteration ends when the table runs low)."""
        return self.kind in CONSUMING


@dataclass(frozen=True)
class ServiceWriter:
    """Stands for a table's writer, run by the server.

    Attributes:
        table: the table's name.
        kind: ``round_robin`` or ``max_value``.
    """

    table: str
    kind: str
    is_remote: bool = True
