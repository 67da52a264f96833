"""A memmap table's raw per-slot column files: made as holes, mapped with the dtype and
shape the spec gives (never read from the file), upgraded from earlier layouts.

The files hold little-endian arrays and nothing else: no header, no pickle. A
never-written slot's state is zeros, so a new file is a hole of the table's
capacity and takes disk as the rows' extents reserve it (:mod:`.extents`).

    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = Path(d) / "slots.live.bin"
    ...     create_file(path, 1 << 20)
    ...     live = map_file(path, torch.bool, (1 << 20,))
    ...     blocks = path.stat().st_blocks
    ...     (bool(live.any()), blocks)
    (False, 0)
"""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path

import torch

from .diskspace import FALLOCATE_UNSUPPORTED, fsync_path, on_full_disk
from .errors import BackendError

#: per-slot columns later versions added: missing from an older table's state, they
#: are created as zeros (what they hold for items written before them)
ADDED_COLUMNS = frozenset({"slots.tag"})
#: columns stored under another name and meaning by earlier versions: the new column's
#: name -> (the old one's, how to convert its tensor); converted once, at the first open
RENAMED_COLUMNS = {
    # (times sampled, insert number with -1 for never written) -> (times sampled, ordinal)
    "slots.sampled_ordinal": ("slots.pairs", lambda t: t + torch.tensor([0, 1])),
}


def create_file(path: Path, nbytes: int, *, reserve: bool = False) -> None:
    """A zero-filled file of ``nbytes``: a hole (the table's extents reserve its blocks with
    the rows'), or with ``reserve`` its blocks allocated now (ENOSPC here, not SIGBUS later)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if nbytes and reserve:
            try:
                with on_full_disk(f"a state file of {nbytes} bytes", path):
                    os.posix_fallocate(fd, 0, nbytes)
            except OSError as err:
                if err.errno not in FALLOCATE_UNSUPPORTED:
                    raise
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)


def data_end(path: Path) -> int:
    """Bytes of ``path`` up to the end of its last data: past it the file is a hole (zeros,
    never written), and not read (a tmpfs backs a hole's page when it is read, and on a full
    one that read is a SIGBUS). The whole file where the file system tells no holes.

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     path = Path(d) / "slots.live.bin"
        ...     create_file(path, 1 << 20)
        ...     empty = data_end(path)
        ...     with open(path, "r+b") as f:
        ...         _ = f.write(b"x")
        ...     (empty, 0 < data_end(path) < 1 << 20)
        (0, True)
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        end = at = 0
        while at < size:  # data extent by data extent: a column written from slot 0 has one
            try:
                at = os.lseek(fd, at, os.SEEK_DATA)
            except OSError as err:
                return end if err.errno == errno.ENXIO else size  # holes to the end / no seek
            at = end = os.lseek(fd, at, os.SEEK_HOLE)
        return min(end, size)
    finally:
        os.close(fd)


def map_file(path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The raw file ``path`` as a shared (writable) tensor of ``dtype`` and ``shape``.

    The dtype and shape come from the caller (the spec), never from the file;
    its size must match exactly. torch maps the file and closes it (no file
    descriptor is kept).

    Raises:
        BackendError: the file is missing or has another size.
    """
    expected = math.prod(shape) * dtype.itemsize
    got = path.stat().st_size if path.is_file() else None
    if got != expected:
        what = "is missing" if got is None else f"holds {got} bytes"
        raise BackendError(f"{path} {what}, expected {expected}: the table's files are damaged")
    if not expected:
        return torch.empty(shape, dtype=dtype)
    return torch.from_file(str(path), shared=True, size=math.prod(shape), dtype=dtype).view(shape)


def upgrade_column(folder: Path, name: str, like: torch.Tensor) -> None:
    """Convert the column an earlier version kept under another name (:data:`RENAMED_COLUMNS`)
    into ``name``'s file, once: written under a temporary name, flushed, renamed, and only
    then the old file deleted; a crash anywhere leaves the old file or the new one whole."""
    path = folder / f"{name}.bin"
    old_name, convert = RENAMED_COLUMNS[name]
    old = folder / f"{old_name}.bin"
    if path.exists():
        old.unlink(missing_ok=True)  # a conversion cut short after its rename
        return
    if not old.exists():
        return  # map_file names the missing file
    tmp = folder / f".{name}.bin.tmp"
    tmp.unlink(missing_ok=True)
    create_file(tmp, like.numel() * like.element_size(), reserve=True)
    converted = map_file(tmp, like.dtype, tuple(like.shape))
    converted.copy_(convert(map_file(old, like.dtype, tuple(like.shape))))
    del converted
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(folder)
    old.unlink()
