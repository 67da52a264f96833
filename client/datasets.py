"""Exports to files and datasets, and datasets into tables, on the caller's side: as plans,
which both client twins drive (:mod:`.steps`).

:func:`download` streams an export into a file next to its destination and
renames it into place at the end (bounded memory; never half a file under the
final name). :func:`export_minari` makes a Minari dataset of a table: on the
server (``path=``), or here from a streamed Parquet export;
:func:`import_dataset` and :func:`import_parquet` extend a table with a Minari
dataset's episodes or a Parquet file's rows. The conversions are
:mod:`tdreplay.codec.minari_files`, the same the server and the offline CLI
use, and :mod:`tdreplay.codec.parquet_read`, which ``Table.import_parquet`` reads
with too (one import policy: :mod:`tdreplay.codec.parquet_import`).

Each is written once: its requests are :class:`~.steps.Call` steps, which the
blocking client sends with blocking I/O and the asyncio client over its own
transport (a streamed body poured into the file as it arrives); its file work
(reading Parquet, converting, writing a dataset) is :class:`~.steps.Work`, run in
place by the blocking client and in a worker thread by the asyncio client, so the
event loop never waits on a disk. An import that fails after writing says how
many rows it wrote, in a note on the error (``err.__notes__``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tqdm import tqdm

from ..codec import minari_files
from ..codec.dtypes import TORCH
from ..codec.episodes import trajectory_key_of
from ..codec.errors import InvalidRequest, PathExists
from ..codec.exports import ExportedPath, counted, export_format, into_place, keep_existing
from ..codec.folders import made_for
from ..codec.parquet_import import refused_values
from ..codec.parquet_read import parquet_files, read_parquet
from ..codec.protocol import (
    IMPORT_CHUNK,
    MAX_BATCH_BYTES,
    import_batch_bytes,
    import_chunk,
    import_rows,
    note_written,
    rows_written,
)
from .plans import Plans
from .sinks import aside
from .steps import Plan, Work

MINARI = "minari"


def export(
    plans: Plans,
    table: str,
    format: str | None = None,
    path: str | None = None,
    dest: str | Path | None = None,
    dataset_id: str | None = None,
    env_spec: Any = None,
    progress: bool | None = None,
    replace: bool = True,
) -> Plan[Any]:
    """An export, as :meth:`~tdreplay.client.ReplayClient.export` takes it: a Minari
    dataset (:func:`export_minari`), a file here (:func:`download`), or the server's."""
    if format == MINARI:
        return (
            yield from export_minari(
                plans,
                table,
                dataset_id=dataset_id,
                path=path,
                dest=dest,
                env_spec=env_spec,
                progress=progress,
            )
        )
    if path is None and dest is not None:
        return (yield from download(plans, table, format, Path(dest), progress, replace=replace))
    return (yield from plans.export(table, format, path))


def download(
    plans: Plans,
    table: str,
    format: str | None,
    dest: Path,
    progress: bool | None = None,
    *,
    replace: bool = True,
) -> Plan[Path]:
    """Stream ``table``'s export as ``format`` (default: from ``dest``'s suffix) into
    ``dest``, atomically; returns ``dest``. ``replace=False``: a file at ``dest`` is kept
    (:func:`~tdreplay.codec.exports.keep_existing` before the transfer,
    :func:`~tdreplay.codec.exports.into_place` at the end).

    Raises:
        InvalidRequest: ``dest`` is a folder, or ``format`` is not one its suffix names
            (:func:`~tdreplay.codec.exports.export_format`), found before the table is
            exported: the rename at the end would fail after the whole transfer.
        PathExists: ``replace`` is ``False`` and something is at ``dest`` (before the
            transfer, or put there while it ran).
    """
    if dest.is_dir():
        raise InvalidRequest(
            f"table {table!r}: export path {str(dest)!r} is a folder; give a file",
            table=table,
            field="dest",
            got=str(dest),
        )
    fmt = export_format(dest, format, table)
    if not replace:
        keep_existing(dest, table, str(dest))
    with aside(dest, progress=progress, desc=f"export {table}") as sink:
        got = yield from plans.export(table, fmt, sink=sink)
        into_place(sink.path, dest, replace=replace, table=table, shown=str(dest))
    return counted(ExportedPath.of(dest), {k: getattr(got, k, None) for k in ("rows", "skipped")})


def export_minari(
    plans: Plans,
    table: str,
    *,
    dataset_id: str | None,
    path: str | None = None,
    dest: str | Path | None = None,
    env_spec: Any = None,
    progress: bool | None = None,
    replace: bool = True,
) -> Plan[Any]:
    """``table`` as the Minari dataset ``dataset_id``: written by the server under its
    ``path`` (a datasets root inside ``exports/``; returns the dataset's path there), else
    under the datasets root ``dest`` here (default: Minari's; returns the dataset's folder).

    Raises:
        InvalidRequest: no or a malformed ``dataset_id`` or ``env_spec``.
        PathExists: the dataset exists already.
        SchemaError: the table lacks a key an episode needs, or no episode boundary is
            found (:mod:`tdreplay.codec.episodes`), or a value is outside its field's
            categories (:mod:`tdreplay.codec.spaces`).
    """
    if dataset_id is None:
        raise InvalidRequest(
            "a Minari export needs dataset_id (namespace/name-v0)",
            table=table,
            field="dataset_id",
            expected="[namespace/]name-vN",
        )
    spec_json = yield Work(minari_files.env_spec_json, env_spec)  # may import gymnasium
    if path is not None:
        return (
            yield from plans.export(table, MINARI, path, dataset_id=dataset_id, env_spec=spec_json)
        )
    root = Path(dest) if dest is not None else (yield Work(minari_files.default_root))
    folder = minari_files.dataset_folder(root, dataset_id)
    if os.path.lexists(folder):  # before the download, not after it
        raise PathExists(
            f"a dataset {dataset_id!r} exists under {str(root)!r} already",
            table=table,
            field="dataset_id",
            got=dataset_id,
        )
    # a root (and parents) made here go again if the export fails: it leaves nothing it made
    with (
        made_for(root),
        aside(root / f"{table}.parquet", progress=progress, desc=f"export {table}") as sink,
    ):
        got = yield from plans.export(table, "parquet", sink=sink)
        write = functools.partial(
            minari_files.write_minari,
            sink.path,
            root,
            dataset_id,
            env_spec=spec_json,
            progress=progress,
        )
        written = yield Work(write)
        return counted(written, {"skipped": getattr(got, "skipped", None)})


def import_dataset(
    plans: Plans,
    table: str,
    dataset_id: str,
    *,
    format: str = MINARI,
    root: str | Path | None = None,
    chunk: int = IMPORT_CHUNK,
    trajectory_key: str | None = None,
    progress: bool | None = None,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> Plan[int]:
    """Extend ``table`` with the steps of the Minari dataset ``dataset_id``; returns the
    number of items written. See :meth:`~tdreplay.client.ReplayClient.import_dataset`.

    Raises:
        ValueError: ``format`` is not ``"minari"``.
        InvalidRequest: ``chunk`` or ``max_batch_bytes`` is not an integer >= 1 (before
            anything is sent).
    """
    if format != MINARI:
        raise ValueError(f"import_dataset reads Minari datasets, not {format!r}")
    import_chunk(chunk, table)
    import_batch_bytes(max_batch_bytes, table)
    info = yield from plans.info(table)
    fields = info["fields"]
    key = trajectory_key_of(info, trajectory_key)
    read = functools.partial(
        minari_files.read_minari,
        root,
        dataset_id,
        fields,
        trajectory_key=key,
        chunk=import_rows(chunk, info["capacity"], table),
        max_batch_bytes=max_batch_bytes,
    )
    total, chunks = yield Work(read)
    batches = (_typed(fields, rows) for rows in chunks)
    return (yield from _extend_all(plans, table, total, batches, progress))


def import_parquet(
    plans: Plans,
    table: str,
    source: str | Path,
    *,
    columns: dict[str, str] | None = None,
    ignore_extra: bool = False,
    chunk: int = IMPORT_CHUNK,
    progress: bool | None = None,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> Plan[int]:
    """Extend ``table`` with the rows of Parquet files; returns the number of items
    written. See :meth:`~tdreplay.client.ReplayClient.import_parquet`.

    Every file is checked (:mod:`tdreplay.codec.parquet_read`, by the import policy of
    :mod:`tdreplay.codec.parquet_import`, which ``Table.import_parquet`` follows too)
    before the first extend is sent.

    Raises:
        InvalidRequest: ``chunk`` or ``max_batch_bytes`` is not an integer >= 1 (before
            anything is sent).
    """
    import_chunk(chunk, table)
    import_batch_bytes(max_batch_bytes, table)
    info = yield from plans.info(table)
    fields = {k: (v.get("shape") or [], TORCH[v["dtype"]]) for k, v in info["fields"].items()}
    files = yield Work(parquet_files, table, source)
    read = functools.partial(
        read_parquet, table, fields, files, columns, ignore_extra=ignore_extra,
        chunk=import_rows(chunk, info["capacity"], table),
        refused=refused_values(info["fields"], info.get("writer") or {}),
        max_batch_bytes=max_batch_bytes,
    )  # fmt: skip
    total, batches = yield Work(read)
    return (yield from _extend_all(plans, table, total, batches, progress))


def _typed(fields: Mapping[str, Any], rows: Mapping[str, np.ndarray]) -> TensorDict:
    n = len(next(iter(rows.values())))
    leaves = {
        tuple(k.split(".")): torch.from_numpy(v).to(TORCH[fields[k]["dtype"]])
        for k, v in rows.items()
    }
    return TensorDict(leaves, [n])


def _extend_all(
    plans: Plans,
    table: str,
    total: int,
    batches: Iterator[TensorDict],
    progress: bool | None,
) -> Plan[int]:
    """Extend ``table`` with each of ``batches`` (read and decoded as :class:`Work`);
    returns the number of items written. An error gets a note of how many were written
    before it (rows of earlier batches stay written)."""
    written = 0
    disable = not progress if progress is not None else True
    try:
        with tqdm(total=total, desc=f"import {table}", unit="rows", disable=disable) as bar:
            while (batch := (yield Work(next, batches, None))) is not None:
                written += rows_written((yield from plans.extend(table, batch)))
                bar.update(len(batch))
    except Exception as err:
        note_written(err, written, table)
        raise
    return written
