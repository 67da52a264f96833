"""A table's dump on the caller's side: the archives the servers send (one per shard) as
a local folder, and back (both client twins use these; the wire is
:mod:`tdreplay.codec.archive`).

One server: the folder is the table's checkpoint (``metadata.json``, ``storage/``...).
Several: one such folder per server, ``shard-0``, ``shard-1``... in the client's order.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..codec.archive import pack, unpack

#: bytes of files one archive may unpack to at most on the caller's side (what a server
#: answers is what it dumped; the bound keeps a wrong answer from filling the disk)
MAX_DUMP_BYTES = 1 << 40


def folders(path: Path, n: int) -> list[Path]:
    """Where each of ``n`` servers' dumps lives under ``path``."""
    return [path] if n == 1 else [path / f"shard-{i}" for i in range(n)]


def write(archives: Sequence[bytes], path: str | Path) -> Path:
    """Unpack the servers' ``archives`` into ``path`` (a new or empty folder); atomic: the
    dump is written beside it and renamed into place, so ``path`` never holds half of one.

    Raises:
        FileExistsError: ``path`` holds files already.
        CodecError: an archive is not a checkpoint's (the member at fault is named).
    """
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} is not empty: dump into a new or empty folder")
    aside = path.with_name(f".{path.name}.dumping")
    shutil.rmtree(aside, ignore_errors=True)
    aside.parent.mkdir(parents=True, exist_ok=True)
    try:
        parts = folders(aside, len(archives))
        if len(archives) > 1:
            aside.mkdir(mode=0o700)
        for archive, folder in zip(archives, parts, strict=True):
            unpack(archive, folder, max_bytes=MAX_DUMP_BYTES)
        if path.exists():
            path.rmdir()  # empty: checked above
        aside.rename(path)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    return path


def read(path: str | Path, n: int) -> list[bytes]:
    """The archives of a dump :func:`write` made for ``n`` servers.

    Raises:
        FileNotFoundError: no such dump there (for ``n`` servers).
    """
    path = Path(path)
    parts = folders(path, n)
    for folder in parts:
        if not (folder / "metadata.json").is_file():
            raise FileNotFoundError(
                f"{folder} holds no table dump (for {n} server{'s' if n > 1 else ''})"
            )
    return [pack(folder) for folder in parts]


class LocalDumps:
    """``dump`` and ``load`` of the blocking client (:class:`~tdreplay.client.ReplayClient`),
    over its ``dump_archives`` / ``load_archives``."""

    urls: tuple[str, ...]

    def dump_archives(self, table: str) -> list[bytes]:
        raise NotImplementedError  # the client's

    def load_archives(self, table: str, archives: list[bytes]) -> dict[str, Any]:
        raise NotImplementedError  # the client's

    def dump(self, table: str, path: str | Path) -> Path:
        """Write ``table``'s whole state (rows, sampler and priorities, writer position,
        rate-limiter counters: a fresh checkpoint) into the local folder ``path``, streamed
        from the server; :meth:`load` restores it. Sharded: one folder per server
        (``shard-0``...). The folder is new or empty, and written atomically.

        Example:
            >>> client.dump("cartpole", "run-1/buffer")         # doctest: +SKIP
            >>> client.load("cartpole", "run-1/buffer")         # doctest: +SKIP

        Raises:
            FileExistsError: ``path`` holds files already.
            TableNotFound: no such table.
        """
        return write(self.dump_archives(table), path)

    def load(self, table: str, path: str | Path) -> dict[str, Any]:
        """Replace (or create) ``table`` from a local dump :meth:`dump` wrote; returns its info.

        The archive goes up in one request: at most the server's ``--max-body-bytes``.

        Raises:
            FileNotFoundError: no dump at ``path`` (for this client's servers).
            PayloadTooLarge: the dump is over the server's body limit.
            InvalidRequest: the dump is of another table.
        """
        return self.load_archives(table, read(path, len(self.urls)))
