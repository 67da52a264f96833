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

from ..codec.archive import Packed, unpack
from ..codec.protocol import IMPORT_CHUNK, MAX_BATCH_BYTES
from . import datasets
from .plans import Plans
from .sinks import UnpackSink, byte_bar
from .steps import Plan, Work

T = TypeVar("T")

#: bytes of files one archive may unpack to at most on the caller's side (what a server
#: answers is what it dumped; the bound keeps a wrong answer from filling the disk)
MAX_DUMP_BYTES = 1 << 40


def folders(path: Path, n: int) -> list[Path]:
    """Where each of ``n`` servers' dumps lives under ``path``."""
    return [path] if n == 1 else [path / f"shard-{i}" for i in range(n)]


def dump_into(
    plans: Plans, table: str, path: str | Path, progress: bool | None = None
) -> Plan[Path]:
    """A dump of ``table`` into the folder ``path``, as :func:`write` lays it out: each
    server's archive unpacked as it arrives (one read buffer in memory, the files once on
    disk, whatever the table's size) into a hidden folder beside ``path``, renamed into
    place when whole (a dump cut off leaves the hidden folder, which the next one deletes);
    ``progress``: a bar of the bytes received (``None``: when stderr is a terminal)."""
    path = Path(path)
    aside = yield Work(_aside, path, plans.n)
    with byte_bar(progress, f"dump {table}") as bar:
        sinks = [UnpackSink(f, MAX_DUMP_BYTES, bar) for f in folders(aside, plans.n)]
        try:
            yield from plans.dump(table, sinks)
            return (yield Work(_into_place, aside, path))
        finally:
            for sink in sinks:
                sink.discard()  # what a failed dump wrote; nothing once renamed
            shutil.rmtree(aside, ignore_errors=True)


def _aside(path: Path, n: int) -> Path:
    """The hidden folder beside ``path`` a dump of ``n`` servers is written into, emptied
    (a dump cut off left it); ``path`` must be new or empty."""
    _check_empty(path)
    aside = path.with_name(f".{path.name}.dumping")
    shutil.rmtree(aside, ignore_errors=True)
    if n > 1:
        aside.mkdir(mode=0o700)
    return aside


def _into_place(aside: Path, path: Path) -> Path:
    """Rename the whole dump at ``aside`` to ``path`` (new, or empty: checked again)."""
    _check_empty(path)
    if path.exists():
        path.rmdir()
    aside.rename(path)
    return path


def _check_empty(path: Path) -> None:
    """Refuse a dump into a folder holding files; make the folder it goes into.

    Raises:
        FileExistsError: ``path`` holds files already.
    """
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} is not empty: dump into a new or empty folder")
    path.parent.mkdir(parents=True, exist_ok=True)


def write(archives: Sequence[bytes | Path], path: str | Path) -> Path:
    """Unpack the servers' ``archives`` (their bytes, or files holding them) into ``path``
    (a new or empty folder); atomic: the dump is written beside it and renamed into place,
    so ``path`` never holds half of one.

    Raises:
        FileExistsError: ``path`` holds files already.
        CodecError: an archive is not a checkpoint's (the member at fault is named).
    """
    path = Path(path)
    aside = _aside(path, len(archives))
    try:
        for archive, folder in zip(archives, folders(aside, len(archives)), strict=True):
            unpack(archive, folder, max_bytes=MAX_DUMP_BYTES)
        return _into_place(aside, path)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise


def read(path: str | Path, n: int) -> list[Packed]:
    """The archives of a dump :func:`write` made for ``n`` servers, laid out (each read a
    part at a time as it is sent: :class:`~tdreplay.codec.archive.Packed`).

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
    return [Packed(folder) for folder in parts]


class Persistence:
    """The persistence calls of the blocking client (:class:`~tdreplay.client.ReplayClient`):
    checkpoint and restore on the server, dump and load through the caller, export."""

    urls: tuple[str, ...]
    _plans: Plans

    def _run(self, plan: Plan[T]) -> T:
        raise NotImplementedError  # the client's

    def checkpoint(self, table: str, path: str) -> str | list[str]:
        """Checkpoint ``table`` under the server's data root; returns the path written.

        Sharded: each server writes ``{path}-shard{i}``; returns the list.
        """
        return self._run(self._plans.checkpoint(table, path))

    def restore(self, table: str, path: str) -> dict[str, Any]:
        """Restore ``table`` from a checkpoint written by :meth:`checkpoint`; returns its info."""
        return self._run(self._plans.restore(table, path))

    def dump_archives(self, table: str) -> list[bytes]:
        """:meth:`dump` held in memory: each server's archive of ``table``
        (:mod:`tdreplay.codec.archive`), in shard order."""
        return self._run(self._plans.dump(table))

    def load_archives(self, table: str, archives: Sequence[bytes | Packed]) -> dict[str, Any]:
        """:meth:`load` from archives :meth:`dump_archives` returned; returns the table's info."""
        return self._run(self._plans.load(table, archives))

    def export(
        self,
        table: str,
        format: str | None = None,
        *,
        path: str | None = None,
        dest: str | Path | None = None,
        dataset_id: str | None = None,
        env_spec: Any = None,
        progress: bool | None = None,
        replace: bool = True,
    ) -> Any:
        """Export ``table`` as Parquet, CSV or a Minari dataset.

        Parquet and CSV: written on the server with ``path``; streamed into the
        file ``dest`` here (written beside it and renamed at the end, so ``dest`` is
        never half a file; the client holds one read buffer, not the file); with
        neither, returned as bytes. The path returned (a ``str`` for ``path``, a
        ``Path`` for ``dest``) carries ``rows`` (written) and ``skipped`` (rows
        overwritten or removed while a live export ran, left out); Minari adds
        ``splits`` (episodes split where rows were missing inside them).

        Minari (``format="minari"``, ``dataset_id="namespace/name-v0"``): the
        dataset ``minari.load_dataset(dataset_id)`` opens with ``MINARI_DATASETS_PATH``
        set to the datasets root ``dest`` (default: Minari's own root), written here
        from a streamed Parquet export; with ``path``, the server writes it under that
        datasets root inside its ``exports/``. Episodes come from the table's
        trajectory key (``sampler.traj_key``, else ``collector.traj_ids``), else its
        done flags (:mod:`tdreplay.codec.episodes`).

        Args:
            format: ``"parquet"``, ``"csv"`` or ``"minari"``; default: from the suffix
                of ``dest`` or ``path`` (``.parquet``, ``.pq``, ``.csv``), Parquet for bytes.
                A format the file's suffix contradicts is refused (one rule for every
                door: :func:`tdreplay.codec.exports.export_format`).
            path: write it on the server, under its data root (returns that path).
            dest: without ``path``: the file (Parquet, CSV) or datasets root (Minari)
                here; returns the file or the dataset's folder.
            dataset_id: Minari's dataset id.
            env_spec: Minari: the environment's spec for the metadata (a gymnasium
                ``EnvSpec``, its JSON, or a registered id such as ``"CartPole-v1"``).
            progress: a progress bar on stderr (``None``: when it is a terminal).
            replace: Parquet, CSV: replace a file at ``dest``; ``False``: refuse it, before
                the transfer and again, atomically, at the rename
                (:func:`tdreplay.codec.exports.into_place`), leaving it as it was.

        Raises:
            PathExists: the server's ``path``, or the Minari dataset, exists already; a
                file at ``dest`` with ``replace=False``.
            SchemaError: Minari: the table lacks a key an episode needs, or no episode
                boundary is found.
            InvalidRequest: a malformed ``dataset_id`` or ``env_spec``; Parquet, CSV: a
                ``dest`` that is a folder, or a format its suffix does not name (before
                the transfer).
        """
        return self._run(
            datasets.export(
                self._plans, table, format, path, dest, dataset_id, env_spec, progress, replace
            )
        )

    def import_parquet(
        self,
        table: str,
        source: str | Path,
        *,
        columns: dict[str, str] | None = None,
        ignore_extra: bool = False,
        chunk: int = IMPORT_CHUNK,
        progress: bool | None = None,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> int:
        """Extend ``table`` with the rows of a Parquet file, or of a folder of them, ``chunk``
        rows per extend (at most the table's capacity); returns the number of items written.

        The file is read here and checked by the same import policy as
        ``Table.import_parquet`` (:mod:`tdreplay.codec.parquet_import`), so a file gets
        the same answer through either: each field reads the column ``columns`` maps
        it to (``{field: column}``), else the column of its own dotted name; a struct
        column's children are columns named by their dotted path (a struct ``next``
        with ``observation``, as pandas and Hugging Face ``datasets`` write nested
        data, is ``next.observation``). A column no field reads is refused unless
        ``ignore_extra``. Values are cast when no value changes (``int32 -> int64``),
        and floats are rounded into a narrower float field (``float64 -> float32``)
        unless a value would overflow it. A tdreplay export reads back exactly.

        Example:
            >>> client.import_parquet("cartpole", "d4rl.parquet",           # doctest: +SKIP
            ...     columns={"observation": "obs", "next.reward": "rewards"})

        Raises:
            SchemaError: before any row is written: a field without its column (or
                mapped to a struct column rather than one of its children), a column
                no field reads (unless ``ignore_extra``), a mapping naming no field, a
                column name both flat and a struct's child, a column not numeric or
                of a dtype the policy does not cast to the field's, of another shape,
                holding nulls, lists of another length or a value beyond a narrower
                float field's range. The error names the column, the field and the file.
            InvalidRequest: no such file, a folder without Parquet files, a file that
                is not Parquet, ``chunk`` or ``max_batch_bytes`` < 1, a row group whose
                largest pages, one per column read, decompress past ``max_batch_bytes``
                (default 32 MiB: pyarrow decompresses a page whole), refused from the
                pages' headers before any is decompressed.
        """
        return self._run(
            datasets.import_parquet(
                self._plans,
                table,
                source,
                columns=columns,
                ignore_extra=ignore_extra,
                chunk=chunk,
                progress=progress,
                max_batch_bytes=max_batch_bytes,
            )
        )

    def import_dataset(
        self,
        table: str,
        dataset_id: str,
        *,
        format: str = "minari",
        root: str | Path | None = None,
        chunk: int = IMPORT_CHUNK,
        trajectory_key: str | None = None,
        progress: bool | None = None,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> int:
        """Extend ``table`` with every step of the Minari dataset ``dataset_id``, ``chunk``
        rows per extend (at most the table's capacity); returns the number of items written.

        Each step becomes one row in TorchRL's TED layout: ``observation`` /
        ``next.observation`` (the episode's observations but the last / but the first),
        ``action``, ``next.reward``, ``next.terminated``, ``next.truncated``,
        ``next.done``, the root flags (false), and the table's trajectory key
        (``trajectory_key``, default ``sampler.traj_key``, else ``collector.traj_ids``)
        set to the episode's id; a
        field found in the episode's ``infos`` under its dotted key (as an export put
        it there) is taken from there first. Values are cast to the field's dtype.

        Args:
            root: the datasets root; default: Minari's (``MINARI_DATASETS_PATH``).
            max_batch_bytes: the most bytes one compressed unit of the dataset's files (an
                Arrow record batch, a Parquet page: each decompressed whole) may decompress
                to (default 32 MiB); a file holding a larger one is refused.

        Raises:
            InvalidRequest: no such dataset under the root (the error lists those there).
            SchemaError: a field of the table has no source in the dataset, or one with
                another number of elements (the error names the field). Rows of earlier
                chunks stay written.
        """
        return self._run(
            datasets.import_dataset(
                self._plans,
                table,
                dataset_id,
                format=format,
                root=root,
                chunk=chunk,
                trajectory_key=trajectory_key,
                progress=progress,
                max_batch_bytes=max_batch_bytes,
            )
        )

    def dump(self, table: str, path: str | Path, *, progress: bool | None = None) -> Path:
        """Write ``table``'s whole state (rows, sampler and priorities, writer position,
        rate-limiter counters: a fresh checkpoint) into the local folder ``path``, streamed
        from the server and unpacked as it arrives (one read buffer in memory here, the
        files once on disk, whatever the table's size); :meth:`load` restores it. Sharded: one folder per server
        (``shard-0``...). The folder is new or empty, and written atomically.

        Example:
            >>> client.dump("cartpole", "run-1/buffer")         # doctest: +SKIP
            >>> client.load("cartpole", "run-1/buffer")         # doctest: +SKIP

        Args:
            progress: a bar of the bytes received on stderr (``None``: when it is a terminal).

        Raises:
            FileExistsError: ``path`` holds files already.
            TableNotFound: no such table.
        """
        return self._run(dump_into(self._plans, table, path, progress))

    def load(self, table: str, path: str | Path, *, progress: bool | None = None) -> dict[str, Any]:
        """Replace (or create) ``table`` from a local dump :meth:`dump` wrote; returns its info.

        The archive goes up in parts, each one request within the server's
        ``--max-body-bytes``, staged on the server and restored once whole (the table is
        swapped atomically: a load that fails or is cut off leaves it as it was). The
        archive is read from the dump's files a part at a time (at most 64 MiB in memory
        here, whatever the dump's size), as :meth:`dump` streams it in.

        Args:
            progress: a bar of the bytes sent on stderr (``None``: when it is a terminal).

        Raises:
            FileNotFoundError: no dump at ``path`` (for this client's servers).
            PayloadTooLarge: the dump is over the server's ``--max-load-bytes``.
            InvalidRequest: the dump is of another table.
            CodecError: the dump is not a whole archive (the member at fault is named).
        """
        return self._run(self._plans.load(table, read(path, len(self.urls)), progress))
