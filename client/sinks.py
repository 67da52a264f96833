"""Where a streamed answer goes: :class:`FileSink` writes a body into a file as it arrives
(:attr:`~tdreplay.client.commands.Request.sink`), so an export of any size costs the
client one read buffer, not the file; :class:`UnpackSink` unpacks an archive (a dump) into
a folder as it arrives, so a dump's disk is its files, once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from ..codec.archive import Unpacker
from ..codec.folders import made_for


class FileSink:
    """A body written into ``path``, piece by piece; :meth:`start` begins it anew (each
    attempt of a retried request does), :meth:`close` ends it.

    Args:
        path: the file (created or truncated).
        bar: a tqdm bar counting the bytes (reset on every start), if any.
    """

    def __init__(self, path: Path, bar: Any = None) -> None:
        self.path = path
        self.bar = bar
        self.nbytes = 0
        self._file: BinaryIO | None = None

    def start(self) -> None:
        self.close()
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close(), after the body
        self.nbytes = 0
        if self.bar is not None:
            self.bar.reset()

    def __call__(self, piece: memoryview) -> None:
        assert self._file is not None, "FileSink written before start()"
        self._file.write(piece)
        self.nbytes += len(piece)
        if self.bar is not None:
            self.bar.update(len(piece))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class UnpackSink:
    """An archive body unpacked into the new folder ``path`` as it arrives
    (:class:`~tdreplay.codec.archive.Unpacker`: the archive's rules, one member's bytes
    at a time). :meth:`start` begins anew (each attempt of a retried request: what an
    earlier one wrote is deleted), :meth:`close` checks the archive ended whole,
    :meth:`discard` deletes what was written.

    Args:
        path: the folder (its parent must exist).
        max_bytes: bytes of files the archive may unpack to at most.
        bar: a tqdm bar counting the bytes (shared by the sinks of a sharded dump), if any.
    """

    def __init__(self, path: Path, max_bytes: int, bar: Any = None) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.bar = bar
        self.nbytes = 0
        self._unpacker: Unpacker | None = None

    def start(self) -> None:
        self.discard()
        if self.bar is not None and self.nbytes:
            self.bar.update(-self.nbytes)  # an earlier attempt's bytes
        self.nbytes = 0
        self._unpacker = Unpacker(self.path, max_bytes=self.max_bytes)

    def __call__(self, piece: memoryview) -> None:
        assert self._unpacker is not None, "UnpackSink written before start()"
        self._unpacker.feed(piece)
        self.nbytes += len(piece)
        if self.bar is not None:
            self.bar.update(len(piece))

    def close(self) -> None:
        """The body ended: the archive must have too.

        Raises:
            CodecError: it was cut short.
        """
        unpacker, self._unpacker = self._unpacker, None
        if unpacker is not None:
            unpacker.finish()

    def discard(self) -> None:
        """Stop, and delete the folder as far as it was written."""
        unpacker, self._unpacker = self._unpacker, None
        if unpacker is not None:
            unpacker.close()
        shutil.rmtree(self.path, ignore_errors=True)


@contextlib.contextmanager
def aside(dest: Path, *, progress: bool | None = None, desc: str = "") -> Iterator[FileSink]:
    """A :class:`FileSink` on a hidden file next to ``dest`` (its folder made), deleted when
    the block ends: move it into place inside the block (:func:`os.replace`) to keep it. If
    the block fails, the folders made for it go again (:func:`~tdreplay.codec.folders.made_for`).

    Args:
        dest: where the file's content is going.
        progress: a bar of the bytes received (``None``: when stderr is a terminal).
        desc: the bar's label.
    """
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with made_for(dest.parent), byte_bar(progress, desc) as bar:
        sink = FileSink(tmp, bar)
        try:
            yield sink
        finally:
            sink.close()
            tmp.unlink(missing_ok=True)


def byte_bar(progress: bool | None, desc: str, total: int | None = None) -> Any:
    """A tqdm bar of bytes on stderr (``progress`` ``None``: when stderr is a terminal)."""
    disable = not progress if progress is not None else not _tty()
    return tqdm(desc=desc, total=total, unit="B", unit_scale=True, disable=disable)


def _tty() -> bool:
    import sys

    return sys.stderr.isatty()
