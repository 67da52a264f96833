"""Where the loader's batches land: reused receive buffers, and the device they go to."""

from __future__ import annotations

import threading
from typing import Any

import torch

_ALIGN = 64


class Slot:
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

    def reset(self) -> None:
        if self.event is not None:
            self.event.synchronize()  # the previous copy out of this buffer is done
            self.event = None
        if self.want > (self.buf.numel() if self.buf is not None else 0):
            size = int(self.want * 1.25) + _ALIGN
            self.buf = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
            self.view = memoryview(self.buf.numpy())  # type: ignore[arg-type]
        self.offset = self.want = 0

    def alloc(self, n: int) -> memoryview:
        with self.lock:
            start = -(-self.offset // _ALIGN) * _ALIGN
            self.want = max(self.want, start + n)
            if self.view is None or start + n > len(self.view):
                return memoryview(bytearray(n))
            self.offset = start + n
            return self.view[start : start + n]


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
