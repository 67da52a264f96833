"""The writer's chunking rule, without I/O: when a buffer of steps becomes a chunk.

Shared by :class:`~tdreplay.client.writer.Writer` and its async twin; the rule
itself (plain tables: exact chunks; slice tables: chunks end at episode
boundaries) is described in :mod:`tdreplay.client.writer`.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> buf = ChunkBuffer(3, end_key="done")
    >>> for t in range(5):
    ...     buf.append(TensorDict({"done": torch.tensor([t == 3])}, []))
    >>> [c.batch_size[0] for c in buf.take()], buf.unfinished()
    ([4], 1)
"""

from __future__ import annotations

import time
import warnings
from typing import Any, cast

import torch
from tensordict import TensorDictBase

from .commands import as_batch


class ChunkBuffer:
    """The writer's buffer and chunking rule, without I/O (shared by both writers).

    Args:
        chunk: steps per chunk (a target for trajectory tables, see the module doc).
        episode_key: dotted key of a per-step trajectory id, or ``None``.
        end_key: dotted key of a per-step end flag, or ``None``.
        max_rows: the most rows one chunk may hold (the table's capacity).
    """

    def __init__(
        self,
        chunk: int,
        *,
        episode_key: str | None = None,
        end_key: str | None = None,
        max_rows: int | None = None,
    ) -> None:
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.chunk = chunk
        self.episode_key = tuple(episode_key.split(".")) if episode_key else None
        self.end_key = tuple(end_key.split(".")) if end_key else None
        self.max_rows = max_rows or None
        if self.max_rows is not None:
            self.chunk = min(chunk, self.max_rows)  # a bigger insert could never fit
        self.parts: list[TensorDictBase] = []
        self.n = 0
        self.boundaries: list[int] = []  # row counts at which whole episodes end
        self.first_at: float | None = None
        self._last_id: int | None = None

    @property
    def trajectory(self) -> bool:
        return self.episode_key is not None or self.end_key is not None

    def append(self, step: Any) -> None:
        td = as_batch(step)
        k = td.batch_size[0]
        if k == 0:
            return
        base = self.n
        if self.end_key is not None:
            flags = td.get(self.end_key).reshape(k, -1).any(-1)
            self.boundaries.extend(base + i + 1 for i in flags.nonzero().flatten().tolist())
        elif self.episode_key is not None:
            ids = td.get(self.episode_key).reshape(k).to(torch.int64)
            change = torch.zeros(k, dtype=torch.bool)
            change[1:] = ids[1:] != ids[:-1]
            if self._last_id is not None:
                change[0] = int(ids[0]) != self._last_id
            self.boundaries.extend(
                base + i for i in change.nonzero().flatten().tolist() if base + i
            )
            self._last_id = int(ids[-1])
        self.parts.append(td)
        self.n += k
        if self.first_at is None:
            self.first_at = time.monotonic()

    def due(self, max_delay: float | None) -> float | None:
        """Seconds until the time limit sends what is buffered (``None``: nothing to wait for)."""
        if max_delay is None or self.first_at is None:
            return None
        if self.trajectory and not self.boundaries:
            return None
        return self.first_at + max_delay - time.monotonic()

    def _cut(self, *, expired: bool, final: bool) -> int:
        """Rows to send now from the front of the buffer (0: none)."""
        n, cap = self.n, self.max_rows or self.n
        if not n:
            return 0
        if not self.trajectory:
            if n >= self.chunk:
                return self.chunk
            return min(n, cap) if expired or final else 0
        if final and n <= cap:
            return n
        fits = [b for b in self.boundaries if b <= cap]
        best = fits[-1] if fits else 0
        sealed = self.boundaries[-1] if self.boundaries else 0
        if best and (sealed >= self.chunk or expired or final or n > cap):
            return best
        if n > cap:
            warnings.warn(
                f"an episode is longer than the table's capacity ({cap} steps); "
                "it is sent in pieces, which the sampler sees as separate episodes",
                RuntimeWarning,
                stacklevel=4,
            )
            return cap
        return n if final else 0

    def take(self, *, expired: bool = False, final: bool = False) -> list[TensorDictBase]:
        """The chunks to send now, in order; they leave the buffer."""
        out: list[TensorDictBase] = []
        while True:
            m = self._cut(expired=expired, final=final)
            if not m:
                break
            whole: TensorDictBase = (
                self.parts[0] if len(self.parts) == 1 else cast(Any, torch.cat)(self.parts, 0)
            )
            out.append(whole[:m])
            rest = whole[m:]
            self.parts = [rest] if rest.batch_size[0] else []
            self.n -= m
            self.boundaries = [b - m for b in self.boundaries if b > m]
            self.first_at = time.monotonic() if self.n else None
        return out

    def unfinished(self) -> int:
        """Buffered steps past the last episode boundary (trajectory tables)."""
        return self.n - (self.boundaries[-1] if self.boundaries else 0)

    def clear(self) -> None:
        self.parts, self.n, self.boundaries, self.first_at = [], 0, [], None


def episode_keys(
    info: dict[str, Any], episode_key: str | None, end_key: str | None
) -> tuple[str | None, str | None, int]:
    """``(episode_key, end_key, max_rows)`` for a table, from its info and the caller's overrides."""
    shards = info.get("shards") or [info]
    capacity = min(int(s.get("capacity", 0)) for s in shards) or None
    sampler = info.get("sampler") or {}
    if sampler.get("kind") != "slice":
        return None, None, capacity or 0
    if episode_key or end_key:
        return episode_key, None if episode_key else end_key, capacity or 0
    fields = info.get("fields") or {}
    if sampler.get("traj_key"):
        return str(sampler["traj_key"]), None, capacity or 0
    if sampler.get("end_key"):
        return None, str(sampler["end_key"]), capacity or 0
    if "next.done" in fields:  # the spec's default end_key
        return None, "next.done", capacity or 0
    raise ValueError(
        f"table {info.get('name')!r} samples slices but its info names no traj_key/end_key; "
        "pass writer(..., episode_key=...) or end_key=..."
    )
