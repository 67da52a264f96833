"""``shared``: a table's fields in torch shared-memory segments of ``/dev/shm``, committed
as rows arrive.

torch's own ways to make a shared tensor commit the whole segment at once:
``share_memory_()`` copies the tensor into it (every page written), and a fresh
``UntypedStorage._new_shared(n)`` ``posix_fallocate``s all of it (measured: 512 MiB
of ``Shmem`` for a 512 MiB segment before a byte is written). A ``shared`` table's
segments are made here instead, sparse (``ftruncate``), and handed to torch as the
segment of a storage received from another process (``_new_shared_fd_cpu``, what
``torch.multiprocessing`` does with the descriptor it gets): torch maps it and keeps
the descriptor, so the tensors are shared-memory tensors as before (``is_shared()``;
sent to another process by descriptor). Their pages are reserved in extents ahead of
the write position (:mod:`~tdreplay.storage.extents`, as a memmap table's disk): a
write into a page ``/dev/shm`` has no room for is a SIGBUS, a reservation that does not
fit is a 507.
"""

from __future__ import annotations

import math
import os
import secrets
from pathlib import Path

import torch

from ..extents import Room, Span
from ..spec import NestedKey

#: where the segments of a ``shared`` table are made (what ``shm_open`` uses on Linux)
SHM_DIR = Path("/dev/shm")

#: a full ``SHM_DIR``, as its errors say it
SHARED_MEMORY = Room(
    SHM_DIR,
    f"in shared memory ({SHM_DIR})",
    "Give the server more shared memory (docker run --shm-size, a larger /dev/shm), or use "
    "another backend (memory, memmap)",
)


def segment(nbytes: int) -> torch.UntypedStorage:
    """A fresh shared-memory segment of ``nbytes`` zero bytes, none of them committed.

    The file is made in :data:`SHM_DIR` under a name no one else holds (``O_EXCL``, no
    symlink followed) and unlinked at once: the segment lives as long as torch's mapping
    and descriptor of it (the storage), and leaves nothing behind if the process dies.
    """
    path = SHM_DIR / f"tdreplay_{os.getpid()}_{secrets.token_hex(8)}"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.unlink(path)
        os.ftruncate(fd, nbytes)
        wrap = torch.UntypedStorage._new_shared_fd_cpu  # type: ignore[attr-defined]
        return wrap(fd, nbytes)  # maps a dup of fd and keeps it
    finally:
        os.close(fd)


def shared_zeros(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor of ``shape`` in a :func:`segment` of its own."""
    nbytes = math.prod(shape) * dtype.itemsize
    return torch.empty(0, dtype=torch.uint8).set_(segment(nbytes)).view(dtype).view(shape)


def shared_fields(
    schema: dict[NestedKey, tuple[list[int], torch.dtype]], capacity: list[int]
) -> dict[NestedKey, torch.Tensor]:
    """:func:`shared_zeros` for every field of ``schema``: a ``shared`` table's tensors."""
    return {k: shared_zeros([*capacity, *shape], dtype) for k, (shape, dtype) in schema.items()}


def segment_spans(tensors: list[torch.Tensor], row_bytes: list[int]) -> list[Span]:
    """Where the rows of each of ``tensors`` (:func:`shared_zeros`'s) live: its segment's
    descriptor, which torch holds open as long as the tensor's storage lives."""
    spans = []
    for t, nbytes in zip(tensors, row_bytes, strict=True):
        fd, _ = t.untyped_storage()._share_fd_cpu_()  # the segment's own: nothing is copied
        spans.append(Span(fd, int(t.storage_offset()) * t.element_size(), nbytes))
    return spans
