"""Exports to files and datasets, and datasets into tables, on the caller's side.

:func:`download` streams an export into a file next to its destination and
renames it into place at the end (bounded memory; never half a file under the
final name). :func:`export_minari` makes a Minari dataset of a table: on the
server (``path=``), or here from a streamed Parquet export;
:func:`import_minari` extends a table with a Minari dataset's episodes. The
conversions are :mod:`tdreplay.codec.minari_files`, the same the server and
the offline CLI use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from tqdm import tqdm

from ..codec import minari_files
from ..codec.dtypes import TORCH
from ..codec.episodes import trajectory_key_of
from ..codec.errors import InvalidRequest, PathExists
from .parquet_rows import nest_rows, parquet_files, read_rows
from .sinks import aside

MINARI = "minari"


def download(
    client: Any, table: str, format: str, dest: Path, progress: bool | None = None
) -> Path:
    """Stream ``table``'s export as ``format`` into ``dest``, atomically; returns ``dest``."""
    with aside(dest, progress=progress, desc=f"export {table}") as sink:
        client._run(client._calls.export(table, format, sink=sink))
        os.replace(sink.path, dest)
    return dest


def export_minari(
    client: Any,
    table: str,
    *,
    dataset_id: str | None,
    path: str | None = None,
    dest: str | Path | None = None,
    env_spec: Any = None,
    progress: bool | None = None,
) -> Any:
    """``table`` as the Minari dataset ``dataset_id``: written by the server under its
    ``path`` (a datasets root inside ``exports/``; returns the dataset's path there), else
    under the datasets root ``dest`` here (default: Minari's; returns the dataset's folder).

    Raises:
        InvalidRequest: no or a malformed ``dataset_id`` or ``env_spec``.
        PathExists: the dataset exists already.
        SchemaError: the table lacks a key an episode needs, or no episode boundary is
            found (:mod:`tdreplay.codec.episodes`).
    """
    if dataset_id is None:
        raise InvalidRequest(
            "a Minari export needs dataset_id (namespace/name-v0)",
            table=table,
            field="dataset_id",
            expected="[namespace/]name-vN",
        )
    spec_json = minari_files.env_spec_json(env_spec)
    if path is not None:
        plan = client._calls.export(table, MINARI, path, dataset_id=dataset_id, env_spec=spec_json)
        return client._run(plan)
    root = Path(dest) if dest is not None else minari_files.default_root()
    folder = minari_files.dataset_folder(root, dataset_id)
    if os.path.lexists(folder):  # before the download, not after it
        raise PathExists(
            f"a dataset {dataset_id!r} exists under {str(root)!r} already",
            table=table,
            field="dataset_id",
            got=dataset_id,
        )
    with aside(root / f"{table}.parquet", progress=progress, desc=f"export {table}") as sink:
        client._run(client._calls.export(table, "parquet", sink=sink))
        return minari_files.write_minari(
            sink.path, root, dataset_id, env_spec=spec_json, progress=progress
        )


def import_minari(
    client: Any,
    table: str,
    dataset_id: str,
    *,
    root: str | Path | None = None,
    chunk: int = 4096,
    trajectory_key: str | None = None,
    progress: bool | None = None,
) -> int:
    """Extend ``table`` with the steps of the Minari dataset ``dataset_id``; returns the
    number of items written. See :meth:`~tdreplay.client.ReplayClient.import_dataset`."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    info = client.info(table)
    fields = info["fields"]
    key = trajectory_key_of(info, trajectory_key)
    total, chunks = minari_files.read_minari(
        root, dataset_id, fields, trajectory_key=key, chunk=chunk
    )
    written = 0
    disable = not progress if progress is not None else True
    with tqdm(total=total, desc=f"import {table}", unit="rows", disable=disable) as bar:
        for rows in chunks:
            n = len(next(iter(rows.values())))
            leaves = {
                tuple(k.split(".")): torch.from_numpy(v).to(TORCH[fields[k]["dtype"]])
                for k, v in rows.items()
            }
            written += len(client.extend(table, TensorDict(leaves, [n])))
            bar.update(n)
    return written


def import_parquet(
    client: Any,
    table: str,
    source: str | Path,
    *,
    columns: dict[str, str] | None = None,
    chunk: int = 4096,
    progress: bool | None = None,
) -> int:
    """Extend ``table`` with the rows of Parquet files (:mod:`.parquet_rows`); returns the
    number of items written. See :meth:`~tdreplay.client.ReplayClient.import_parquet`."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    fields = client.info(table)["fields"]
    total, batches = read_rows(fields, parquet_files(source), columns, chunk)
    written = 0
    disable = not progress if progress is not None else True
    with tqdm(total=total, desc=f"import {table}", unit="rows", disable=disable) as bar:
        for _, rows in batches:
            n = len(next(iter(rows.values())))
            written += len(client.extend(table, nest_rows(rows, n)))
            bar.update(n)
    return written
