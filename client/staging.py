"""Where the loader's batches land (reused receive buffers, the device they go to), and how
far ahead its fetchers may run (prefetch credits)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

import torch
from tensordict import TensorDictBase

_ALIGN = 64
#: pieces (and what was built on them) a buffer keeps at most
_MAX_KEPT = 64

T = TypeVar("T")


class StagingBuffer:
    """One reusable receive buffer (pinned when the batches go to CUDA).

    ``alloc`` hands out aligned pieces of it (several per batch when sharded);
    a piece that does not fit gets a fresh buffer this time, and the slot
    grows before its next use.
    """

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self.buf: torch.Tensor | None = None
        self.view: memoryview | None = None
        self.offset = 0
        self.want = 0
        self.event: Any = None  # torch.cuda.Event of the copy out of this buffer
        self.lock = threading.Lock()
        #: the pieces handed out, by (start, size): the same piece object each time
        self._pieces: dict[tuple[int, int], memoryview] = {}
        #: what was built on them (:meth:`kept`), by (id of the piece, key)
        self._kept: dict[tuple[int, Hashable], Any] = {}

    def reset(self) -> None:
        if self.event is not None:
            self.event.synchronize()  # the previous copy out of this buffer is done
            self.event = None
        if self.want > (self.buf.numel() if self.buf is not None else 0):
            size = int(self.want * 1.25) + _ALIGN
            self.buf = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
            self.view = memoryview(self.buf.numpy())  # type: ignore[arg-type]
            self._pieces, self._kept = {}, {}
        self.offset = self.want = 0

    def alloc(self, n: int) -> memoryview:
        with self.lock:
            start = -(-self.offset // _ALIGN) * _ALIGN
            self.want = max(self.want, start + n)
            if self.view is None or start + n > len(self.view):
                return memoryview(bytearray(n))
            self.offset = start + n
            piece = self._pieces.get((start, n))
            if piece is None:
                if len(self._pieces) >= _MAX_KEPT:  # sharded batches: their pieces vary
                    self._pieces, self._kept = {}, {}
                piece = self._pieces[start, n] = self.view[start : start + n]
            return piece

    __call__ = alloc

    def kept(self, key: Hashable, piece: memoryview, make: Callable[[], T]) -> T:
        """``make()``, built once per ``key`` on ``piece`` (a piece :meth:`alloc` gave)
        while this buffer lasts: the tensors viewing the piece, say, that a batch is
        decoded into again and again.

        Building them costs a torch call per column, and each torch call hands the GIL
        over: with four fetchers of one-item batches over shm, building a batch's column
        views anew per batch made the loader 1.4-2.3x slower.
        """
        if piece.obj is not (self.view.obj if self.view is not None else None):
            return make()  # a fresh buffer (the piece did not fit): nothing to keep it with
        at = (id(piece), key)  # the piece is held in _pieces: its id is not reused meanwhile
        got = self._kept.get(at)
        if got is None:
            got = self._kept[at] = make()
        return cast(T, got)

    def to_device(
        self, td: TensorDictBase, device: torch.device
    ) -> tuple[TensorDictBase, list[torch.Tensor]] | None:
        """``td``, decoded into this buffer, on ``device`` by ONE copy of the bytes its
        leaves span in the buffer.

        One allocation and one ``non_blocking`` copy (on the caller's current stream),
        and each of those leaves a view of that copy at its offset; a leaf decoded
        elsewhere (a ``bool`` column, unpacked from Arrow's bits into a tensor of its
        own) is copied by itself. Returned with the device tensors that own the batch's
        memory (the one copy first), those a consumer on another stream has to
        ``record_stream``. Per leaf, an allocation, a copy and a ``record_stream`` each
        cost the learner and the fetchers a CUDA call that contends with the other
        threads' (on an H200, the learner's hand-over of a six-field batch took
        0.28-0.42 ms copied leaf by leaf, 0.13-0.22 ms copied this way, in one run).
        The leaves viewing the copy share its allocation: one kept alone keeps it all.

        None (copy leaf by leaf) when no leaf lies in this buffer: a fresh buffer this
        time, or parts concatenated elsewhere.

            >>> from tensordict import TensorDict
            >>> staging = StagingBuffer(pinned=False)
            >>> staging.want = 256
            >>> staging.reset()
            >>> piece = staging.alloc(16)
            >>> td = TensorDict({"x": torch.frombuffer(piece, dtype=torch.int32)}, [4])
            >>> td["x"][:] = torch.arange(4)
            >>> moved, owners = staging.to_device(td, torch.device("cpu"))
            >>> moved["x"].tolist(), [t.numel() for t in owners]
            ([0, 1, 2, 3], [16])
        """
        buf = self.buf
        if buf is None or buf.data_ptr() % _ALIGN:
            return None
        base = buf.data_ptr()
        end = base + buf.numel()
        lo, hi = end, base
        for t in td.values(include_nested=True, leaves_only=True):
            if _within(t, base, end):
                lo, hi = min(lo, t.data_ptr()), max(hi, t.data_ptr() + t.nbytes)
        if hi <= lo:
            return None
        lo -= (lo - base) % _ALIGN  # each leaf's offset stays a multiple of its item size
        whole = buf[lo - base : hi - base].to(device, non_blocking=True, copy=True)
        owners = [whole]

        def moved(t: torch.Tensor) -> torch.Tensor:
            if _within(t, lo, hi):
                at = t.data_ptr() - lo
                return whole[at : at + t.nbytes].view(t.dtype).view(t.shape)
            own = t.to(device, non_blocking=True)
            owners.append(own)
            return own

        return td.apply(moved, device=device), owners


def _within(t: object, lo: int, hi: int) -> bool:
    """``t`` is a contiguous tensor whose bytes lie in ``[lo, hi)`` (addresses)."""
    return (
        isinstance(t, torch.Tensor)
        and t.is_contiguous()
        and lo <= t.data_ptr()
        and t.data_ptr() + t.nbytes <= hi
    )


def check_device(device: str | torch.device | None) -> torch.device | None:
    """``device`` as a ``torch.device``; a CUDA device this process cannot use is an error now.

    (Found later, in a fetcher thread, it would leave the learner waiting.)
    """
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"loader device={str(device)!r}: CUDA is not available to this process "
                "(torch.cuda.is_available() is False); pass device='cpu' or None"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RuntimeError(
                f"loader device={str(device)!r}: this process sees "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    return dev


class Credits:
    """How many more batches the fetchers may fetch ahead, given back as the learner takes them.

    A semaphore, with hysteresis for a stream: once the credits run out, its
    fetcher sleeps until ``wake`` of them are back (half of ``prefetch``),
    then fetches that many in a row. A plain semaphore wakes it for every
    batch taken, so every small batch paid two thread wake-ups (the learner
    waking the fetcher, the fetcher the learner): cartpole batches of
    1 through ``loader(stream=True)`` with ``prefetch=4`` ran 1.10-1.14x
    faster with the hysteresis (two loaders of one process taking turns, three
    runs on an idle machine: 9.3-9.6k against 10.4-10.7k batches/s). A batch
    per request costs far more than a wake-up: those fetchers keep ``wake=1``,
    and the whole ``prefetch`` lookahead.

    A credit given back wakes one waiting fetcher, not all of them: each
    fetcher woken for nothing takes the GIL only to sleep again. Eight fetchers
    of one-item batches over shm spent 400 us of CPU per batch in those
    wake-ups, and made 2-3k batches/s against 8k with one wake-up per credit.
    """

    def __init__(self, n: int, *, wake: int = 1) -> None:
        self._n = n
        self._wake = wake
        self._cond = threading.Condition(threading.Lock())
        self._shut = False  # ran out: closed until ``_wake`` credits are back

    def acquire(self) -> None:
        with self._cond:
            while self._shut or self._n == 0:
                self._cond.wait()
            self._n -= 1
            if self._n == 0:
                self._shut = True

    def release(self) -> None:
        with self._cond:
            self._n += 1
            if self._shut:
                if self._n >= self._wake:
                    self._shut = False
                    self._cond.notify(self._n)  # a fetcher per credit: the rest would only wake
            else:
                self._cond.notify()  # a fetcher may still wait: one woken for the credits before

    def open(self) -> None:
        """Let every fetcher through (to see that the pass is over)."""
        with self._cond:
            self._n += 1 << 30
            self._shut = False
            self._cond.notify_all()
