"""A table's dump on the caller's side: the archives the servers send (one per shard) as
a local folder, and back (both client twins use these; the wire is
:mod:`tdreplay.codec.archive`); and the blocking client's persistence calls
(:class:`Persistence`).

One server: the folder is the table's checkpoint (``metadata.json``, ``storage/``...).
Several: one such folder per server, ``shard-0``, ``shard-1``... in the client's order.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..codec.archive import pack, unpack
from .plans import Calls
from .steps import Plan

T = TypeVar("T")

#: bytes of files one archive may unpack to at most on the caller's side (what a server
#: answers is what it dumped; the bound keeps a wrong answer from filling the disk)
MAX_DUMP_BYTES = 1 << 40


def exported(result: Any, path: str | None, dest: str | Path | None) -> Any:
    """What an export call returns: ``result`` as the plan gave it, or, streamed back with a
    ``dest``, the file written there."""
    if path is None and dest is not None:
        if not isinstance(result, bytes):
            raise ValueError("dest= takes one server's export; pass path= when sharded")
        Path(dest).write_bytes(result)
        return Path(dest)
    return result


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


class Persistence:
    """The persistence calls of the blocking client (:class:`~tdreplay.client.ReplayClient`):
    checkpoint and restore on the server, dump and load through the caller, export."""

    urls: tuple[str, ...]
    _calls: Calls

    def _run(self, plan: Plan[T]) -> T:
        raise NotImplementedError  # the client's

    def checkpoint(self, table: str, path: str) -> str | list[str]:
        """Checkpoint ``table`` under the server's data root; returns the path written.

        Sharded: each server writes ``{path}-shard{i}``; returns the list.
        """
        return self._run(self._calls.checkpoint(table, path))

    def restore(self, table: str, path: str) -> dict[str, Any]:
        """Restore ``table`` from a checkpoint written by :meth:`checkpoint`; returns its info."""
        return self._run(self._calls.restore(table, path))

    def dump_archives(self, table: str) -> list[bytes]:
        """:meth:`dump` held in memory: each server's archive of ``table``
        (:mod:`tdreplay.codec.archive`), in shard order."""
        return self._run(self._calls.dump(table))

    def load_archives(self, table: str, archives: list[bytes]) -> dict[str, Any]:
        """:meth:`load` from archives :meth:`dump_archives` returned; returns the table's info."""
        return self._run(self._calls.load(table, archives))

    def export(
        self,
        table: str,
        format: str = "parquet",
        *,
        path: str | None = None,
        dest: str | Path | None = None,
    ) -> Any:
        """Export ``table`` as Parquet or CSV.

        Args:
            format: ``"parquet"`` or ``"csv"``.
            path: write it on the server, under its data root (returns that path).
            dest: without ``path``: write the streamed file here (returns ``dest``);
                with neither, returns the file's bytes.
        """
        return exported(self._run(self._calls.export(table, format, path)), path, dest)

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
