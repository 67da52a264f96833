"""The writer's chunking rule, without I/O: when a buffer of steps becomes a chunk.

Shared by :class:`~tdreplay.client.writer.Writer` and its async twin: on a plain
table a chunk is ``chunk`` steps exactly; on a slice table the trajectory rule holds.

**The trajectory rule.** On a table whose sampler is ``slice`` (sequences inside
episodes) a chunk always ends at an episode boundary, so an episode never straddles two
inserts (another collector's insert could land between them, and the sampler would lose
or — with end flags — glue the pieces):

* a boundary is after a step whose end flag (the sampler's ``end_key``, e.g.
  ``next.done``) is set, or before a step whose trajectory id (the sampler's
  ``traj_key``, e.g. ``episode``) differs from the previous step's;
* ``chunk`` is then a target, not a cap: the writer sends all the whole episodes it
  holds once they add up to ``chunk`` steps or more; the time limit sends the whole
  episodes held so far; the unfinished episode waits;
* an episode longer than the table's capacity cannot be sent whole: it is split at the
  capacity, with a warning;
* on close, an unfinished episode is sent if episodes are told apart by ``traj_key``
  (its id keeps it apart); with ``end_key`` it is dropped with a warning, as Reverb
  drops data no item covers — sending it would join it to the next insert's first
  episode. End it (set its end flag) to keep it.

The key comes from the table's info, or from ``episode_key=`` / ``end_key=``.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> buf = ChunkBuffer(3, end_key="done")
    >>> [buf.append(TensorDict({"done": torch.tensor([t == 3])}, [])) for t in range(5)]  # due?
    [False, False, False, True, True]
    >>> [c.batch_size[0] for c in buf.take()], buf.unfinished()
    ([4], 1)
"""

from __future__ import annotations

import numbers
import operator
import time
import warnings
from typing import Any

from tensordict import TensorDictBase

from .columns import ColumnBuffer, Lent


def check_chunk(chunk: Any, name: str = "chunk", unit: str = "steps per chunk") -> int:
    """A writer's ``chunk`` (steps per chunk), or another count named ``name``: an int >= 1.

    Raises:
        TypeError: not an int (a bool neither).
        ValueError: below 1.
    """
    try:
        if isinstance(chunk, bool):
            raise TypeError
        n = operator.index(chunk)  # numpy's ints too
    except TypeError:
        raise TypeError(f"{name} must be an int ({unit}), got {chunk!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {n}")
    return n


def check_max_delay(max_delay: Any) -> float | None:
    """A writer's ``max_delay``: seconds a step may wait, >= 0 (``None`` or ``inf``: no limit).

    Checked when the writer is made: the time limit reads it in a timer thread or task,
    where a string ended the timer with a traceback (and the limit with it) and NaN
    sent every step alone.

    Raises:
        TypeError: not a number (a bool neither).
        ValueError: negative or NaN.
    """
    if max_delay is None:
        return None
    if isinstance(max_delay, bool) or not isinstance(max_delay, numbers.Real):
        raise TypeError(f"max_delay must be a number of seconds or None, got {max_delay!r}")
    delay = float(max_delay)
    if not delay >= 0:  # NaN too
        raise ValueError(f"max_delay must be >= 0 seconds (None: no time limit), got {max_delay!r}")
    return delay


class ChunkBuffer:
    """The writer's buffer and chunking rule, without I/O (shared by both writers).

    Steps are copied into preallocated columns as they come
    (:class:`~tdreplay.client.columns.ColumnBuffer`); a chunk is a slice of
    them. The first step fixes the keys, shapes and dtypes every later step
    must have.

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
        self.chunk = chunk = check_chunk(chunk)
        self.episode_key = tuple(episode_key.split(".")) if episode_key else None
        self.end_key = tuple(end_key.split(".")) if end_key else None
        #: whether chunks end at episode boundaries (an attribute: it is read per step)
        self.trajectory = self.episode_key is not None or self.end_key is not None
        self.max_rows = max_rows or None
        if self.max_rows is not None:
            self.chunk = min(chunk, self.max_rows)  # a bigger insert could never fit
        self.boundaries: list[int] = []  # row counts at which whole episodes end
        self.first_at: float | None = None
        self._last_id: int | None = None
        self._rows = ColumnBuffer(self.chunk)

    @property
    def n(self) -> int:
        """Steps buffered."""
        return self._rows.n

    @property
    def waiting(self) -> bool:
        """Whether :meth:`due` is ``None`` for want of a step or a whole episode (a timer sleeps).

        Only an append into a waiting buffer can change what :meth:`due` reads
        (``first_at``, ``boundaries``): one into a buffer that is not waiting
        adds rows and, at most, boundaries. A writer's timer thread therefore
        needs its lock only around appends into a waiting buffer.
        """
        return self.first_at is None or (self.trajectory and not self.boundaries)

    def append(self, step: Any) -> bool:
        """Copy one step (batch ``[]``) or several (``[k]``) into the buffer.

        Returns:
            Whether a chunk is due now (:meth:`ready`; told here, as it is known
            here, since a writer asks after every step).

        Raises:
            KeyError: the step lacks a key the first step had (or the end /
                trajectory key), or has one it had not.
            ValueError, TypeError: a leaf's shape or dtype differs from the first step's.
        """
        rows = self._rows
        base = rows.n
        k = rows.append(step)
        if not k:
            return self.ready()
        if self.first_at is not None and not self.trajectory:
            return rows.n >= self.chunk  # the common case, per step: a plain table's step
        try:
            if self.end_key is not None:
                self._find_ends(base, k)
            elif self.episode_key is not None:
                self._find_starts(base, k)
        except BaseException:
            self._rows.n = base  # the step is not taken
            if not base:  # nor is its layout: the next step may be the right one
                self._rows = ColumnBuffer(self.chunk)
            raise
        if self.first_at is None:
            self.first_at = time.monotonic()
        return self.ready()

    def _column(self, key: tuple[str, ...], base: int, k: int) -> Any:
        try:
            return self._rows.column(key)[base : base + k]
        except ValueError:
            raise KeyError(f"step has no key {'.'.join(key)!r} (the table's episode key)") from None

    def _find_ends(self, base: int, k: int) -> None:
        assert self.end_key is not None
        flags = self._column(self.end_key, base, k)
        if k == 1:
            if flags[0].any():
                self.boundaries.append(base + 1)
            return
        self.boundaries.extend(base + i + 1 for i, f in enumerate(flags.any(-1).tolist()) if f)

    def _find_starts(self, base: int, k: int) -> None:
        assert self.episode_key is not None
        ids = self._column(self.episode_key, base, k)
        if ids.shape[1] != 1:
            raise ValueError(
                f"trajectory id {'.'.join(self.episode_key)!r} must be one value per step, "
                f"got {ids.shape[1]}"
            )
        last = self._last_id
        for i, x in enumerate(ids[:, 0].tolist()):
            x = int(x)
            if last is not None and x != last and base + i:
                self.boundaries.append(base + i)
            last = x
        self._last_id = last

    def ready(self) -> bool:
        """Whether :meth:`take` has a chunk now (a full one; cheaper than asking it, per step)."""
        if not self.trajectory:
            return self._rows.n >= self.chunk
        sealed = self.boundaries[-1] if self.boundaries else 0
        return sealed >= self.chunk or (self.max_rows is not None and self.n > self.max_rows)

    def due(self, max_delay: float | None) -> float | None:
        """Seconds until the time limit sends what is buffered (``None``: nothing to wait for)."""
        if max_delay is None or self.waiting:
            return None
        assert self.first_at is not None
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
        sealed = self.boundaries[-1] if self.boundaries else 0
        if sealed < self.chunk and n <= cap and not (expired or final):
            return 0  # the common case, per step: nothing due
        if final and n <= cap:
            return n
        fits = [b for b in self.boundaries if b <= cap]
        best = fits[-1] if fits else 0
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

    def take(
        self, *, expired: bool = False, final: bool = False, borrow: bool = False
    ) -> list[TensorDictBase]:
        """The chunks to send now, in order; they leave the buffer.

        Args:
            expired: the time limit passed (send what may be sent, even short).
            final: the writer closes (send everything that may be sent).
            borrow: chunks are views on the buffer, valid until the next
                :meth:`append` (the writers send them before that), instead of copies.
        """
        out: list[TensorDictBase] = []
        while True:
            m = self._cut(expired=expired, final=final)
            if not m:
                break
            out.append(self._rows.front(m, copy=not borrow))
            self.boundaries = [b - m for b in self.boundaries if b > m]
            self.first_at = time.monotonic() if self.n else None
        return out

    def take_lent(self) -> tuple[list[TensorDictBase], Lent | None]:
        """The chunks due now (:meth:`take`) as views, and the columns they view, now lent.

        Later appends go to a second set of columns, so the chunks stay valid
        until the lent set is given back with :meth:`reclaim` (a writer that
        sends them in the background).
        """
        out = self.take(borrow=True)
        return out, self._rows.lend() if out else None

    def disown(self) -> None:
        """Append into other columns from now on: the chunks taken as views may still be
        read (a send cancelled while a worker thread copies them out)."""
        self._rows.lend()

    def reclaim(self, lent: Lent | None) -> None:
        """Give back columns :meth:`take_lent` lent, once their chunks are sent."""
        self._rows.reclaim(lent)

    def unfinished(self) -> int:
        """Buffered steps past the last episode boundary (trajectory tables)."""
        return self.n - (self.boundaries[-1] if self.boundaries else 0)

    def clear(self) -> None:
        self._rows.clear()
        self.boundaries, self.first_at = [], None


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
