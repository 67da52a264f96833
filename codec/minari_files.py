"""Minari datasets out of a Parquet export, and rows out of a Minari dataset.

:func:`write_minari` turns a Parquet file in tdreplay's export layout
(:mod:`tdreplay.storage.export`: one column per field, the table's spec in
the schema metadata) into a Minari dataset, episode by episode
(:mod:`tdreplay.codec.episodes` cuts them), through Minari's own writer
(``MinariStorage.new`` / ``update_metadata`` / ``update_episodes``, what
``minari.create_dataset_from_buffers`` calls) given the dataset's folder, so
nothing depends on ``MINARI_DATASETS_PATH`` being set in this process. The
dataset is written beside its final place and renamed into it: an export that
fails leaves no dataset behind. Memory holds one chunk of rows and the
episodes still open.

The spaces are derived from the table's schema (:mod:`tdreplay.codec.spaces`:
``Box``, ``Discrete`` / ``MultiDiscrete`` for fields declaring ``n`` categories,
a ``Dict`` for subtrees; bfloat16 is written as float32), with or
without an env spec, and the data is stored losslessly (no JPEG). The metadata holds ``tdreplay_version``, ``tdreplay_table`` and the
table's spec as JSON (``tdreplay_schema``), and the environment's spec when
one is given. :func:`read_minari` reads any Minari dataset back as rows for a
table's fields (:func:`tdreplay.codec.episodes.episode_rows`).

Minari is an optional dependency: ``pip install "tdreplay[datasets]"``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from .dataset_links import check_inside
from .episodes import EpisodeLayout, EpisodeSplitter
from .errors import InvalidRequest, PathExists, SchemaError
from .exports import ExportedPath
from .folders import made_for
from .from_arrow import to_leaves
from .minari_arrow import arrow_pieces, arrow_steps
from .minari_hdf5 import MAIN_FILE, declared_steps, pieces, table_rows, unreadable
from .minari_parquet import parquet_pieces, parquet_steps
from .protocol import IMPORT_CHUNK, MAX_BATCH_BYTES, import_batch_bytes, import_chunk
from .spaces import categories, check_categories, space_of

log = logging.getLogger(__name__)

__all__ = [
    "DATASET_ID_PATTERN",
    "dataset_folder",
    "default_root",
    "env_spec_json",
    "read_minari",
    "write_minari",
]

#: ``namespace/name-v0``: folders of ASCII letters, digits, ``_ . -`` (none starting with a
#: dot), ending in a version, as ``minari.load_dataset`` takes it
DATASET_ID_PATTERN = r"^([A-Za-z0-9_][A-Za-z0-9_.-]*/)*[A-Za-z0-9_][A-Za-z0-9_.-]*-v[0-9]+$"
#: rows read from the Parquet file at a time
CHUNK_ROWS = 4096
#: episodes handed to Minari's writer at a time
EPISODES_PER_WRITE = 64
#: datasets an error about a missing one lists at most
LISTED = 20


def _minari() -> Any:
    try:
        import minari
    except ImportError:
        raise ImportError('Minari datasets need minari: pip install "tdreplay[datasets]"') from None
    return minari


def dataset_folder(root: str | Path, dataset_id: str) -> Path:
    """Where the dataset ``dataset_id`` lives under the datasets root ``root``.

    Raises:
        InvalidRequest: ``dataset_id`` is not ``[namespace/]name-vN``.
    """
    if not isinstance(dataset_id, str) or not re.fullmatch(DATASET_ID_PATTERN, dataset_id):
        raise InvalidRequest(
            f"dataset id {dataset_id!r} is not of the form namespace/name-v0",
            field="dataset_id",
            expected="[namespace/]name-vN",
            got=str(dataset_id)[:80],
        )
    return Path(root) / dataset_id


def default_root() -> Path:
    """Minari's datasets root: ``MINARI_DATASETS_PATH``, else ``~/.minari/datasets``."""
    _minari()
    from minari.storage import get_dataset_path

    return Path(get_dataset_path())


def env_spec_json(env_spec: Any) -> str | None:
    """The JSON of an environment's spec (a gymnasium ``EnvSpec``, its JSON, or a registered
    id), as a request carries it; ``None`` for none.

    Raises:
        InvalidRequest: it is none of these.
    """
    spec = _env_spec(env_spec)
    return None if spec is None else str(spec.to_json())


def _version() -> str:
    try:
        return metadata.version("tdreplay")
    except metadata.PackageNotFoundError:  # a source tree not installed
        return "unknown"


def _env_spec(env_spec: Any) -> Any:
    """A gymnasium ``EnvSpec`` from one, its JSON, or a registered environment id."""
    if env_spec is None:
        return None
    from gymnasium.envs.registration import EnvSpec, spec

    if isinstance(env_spec, EnvSpec):
        return env_spec
    text = str(env_spec)
    try:
        if text.lstrip().startswith("{"):
            return EnvSpec.from_json(text)
        if ":" in text:  # "module:Env-v0" imports the module: never for a name from a request
            raise ValueError("a module-qualified id; give the spec as JSON")
        return spec(text)
    except Exception as err:
        raise InvalidRequest(
            f"env_spec {text[:80]!r} is neither an EnvSpec's JSON nor a registered "
            f"environment id: {err}",
            field="env_spec",
            got=text[:80],
        ) from None


def _numpy(t: torch.Tensor) -> np.ndarray:
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _rows(pf: pq.ParquetFile, batch: int) -> Iterator[dict[str, np.ndarray]]:
    for rb in pf.iter_batches(batch_size=batch):
        yield {".".join(k): _numpy(v) for k, v in to_leaves(rb).items()}


def _parquet_spec(pf: pq.ParquetFile, path: Path) -> dict[str, Any]:
    raw = (pf.schema_arrow.metadata or {}).get(b"tdreplay.spec")
    if raw is None:
        raise SchemaError(
            f"{str(path)!r} is not a tdreplay export (no tdreplay.spec in its metadata)",
            field="tdreplay.spec",
        )
    return json.loads(raw)


def write_minari(
    parquet: str | Path,
    root: str | Path,
    dataset_id: str,
    *,
    env_spec: Any = None,
    trajectory_key: str | None = None,
    data_format: str = "hdf5",
    description: str | None = None,
    progress: bool | None = False,
) -> ExportedPath:
    """Write the rows of a tdreplay Parquet export as the Minari dataset ``dataset_id``.

    Args:
        parquet: a file :func:`tdreplay.storage.export` wrote (any tdreplay export).
        root: the datasets root (what ``MINARI_DATASETS_PATH`` names); the dataset goes
            to ``root/dataset_id``.
        dataset_id: ``namespace/name-v0``.
        env_spec: the environment's spec, stored in the metadata: a gymnasium
            ``EnvSpec``, its JSON, or a registered id (``"CartPole-v1"``).
        trajectory_key: the field of trajectory ids; default: the table's
            (``sampler.traj_key``, else ``collector.traj_ids``), else the done flags
            cut episodes.
        data_format: Minari's ``"hdf5"``, ``"arrow"`` or ``"parquet"`` (another: Minari's ValueError).
        description: the dataset's description.
        progress: a progress bar over the rows (``None``: when stderr is a terminal).

    Returns:
        The dataset's folder, with its ``rows`` and ``splits`` (episodes split where rows
        were missing inside them, each piece an episode; also logged).

    Raises:
        InvalidRequest: the dataset id or env spec is malformed.
        PathExists: a dataset is there already.
        SchemaError: the file is not a tdreplay export or holds no rows, the table lacks
            a key an episode needs, or no episode boundary is found (see
            :class:`~tdreplay.codec.episodes.EpisodeLayout`).
    """
    minari = _minari()
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    parquet = Path(parquet)
    final = dataset_folder(root, dataset_id)
    if os.path.lexists(final):
        raise PathExists(
            f"a dataset {dataset_id!r} exists under {str(root)!r} already (choose another "
            "id or version)",
            field="dataset_id",
            got=dataset_id,
        )
    env = _env_spec(env_spec)
    with pq.ParquetFile(parquet) as pf:
        spec = _parquet_spec(pf, parquet)
        layout = EpisodeLayout.of(spec, trajectory_key)
        fields = spec["fields"]
        if not pf.metadata.num_rows:  # Minari writes an empty HDF5 file it cannot open
            raise SchemaError(
                f"table {spec.get('name')!r} holds no rows: a Minari dataset needs an episode",
                table=spec.get("name"),
            )
        # the folders made for it go again if it fails: a failed export leaves none behind
        with made_for(final.parent):
            aside = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                aside.mkdir()
                storage = MinariStorage.new(
                    aside.absolute() / "data",  # Minari joins a relative folder to itself
                    observation_space=space_of(fields, layout.observation, "observation"),
                    action_space=space_of(fields, layout.action, "action"),
                    env_spec=env,
                    data_format=data_format,
                    jpeg_encoding=False,
                )
                storage.update_metadata(
                    {
                        "dataset_id": dataset_id,
                        "minari_version": minari.__version__,
                        "tdreplay_version": _version(),
                        "tdreplay_table": str(spec.get("name", "")),
                        "tdreplay_schema": json.dumps(spec),
                        **({"description": description} if description else {}),
                    }
                )
                splitter = EpisodeSplitter(layout)
                declared = categories(fields, [*layout.observation, *layout.action])
                declared |= {f"next.{k}": n for k, n in declared.items() if k in layout.observation}
                pending: list[Any] = []

                def flush(episodes: list[Any]) -> None:
                    pending.extend(
                        EpisodeBuffer(
                            observations=e.observations,
                            actions=e.actions,
                            rewards=e.rewards,
                            terminations=e.terminations,
                            truncations=e.truncations,
                            infos=e.infos,
                        )
                        for e in episodes
                    )
                    if len(pending) >= EPISODES_PER_WRITE:
                        storage.update_episodes(pending)
                        pending.clear()

                total = pf.metadata.num_rows
                show = progress if progress is not None else _tty()
                with tqdm(
                    total=total, desc=f"minari {dataset_id}", unit="rows", disable=not show
                ) as bar:
                    for rows in _rows(pf, CHUNK_ROWS):
                        check_categories(declared, rows, first=splitter.rows)
                        flush(splitter.feed(rows))
                        bar.update(len(next(iter(rows.values()))))
                    flush(splitter.finish())
                if pending:
                    storage.update_episodes(pending)
                os.rename(aside, final)
                if splitter.splits:
                    why = "rows missing inside them (removed, consumed, overwritten)"
                    log.warning(
                        "Minari %r: %d episode splits: %s", dataset_id, splitter.splits, why
                    )
            except BaseException:
                shutil.rmtree(aside, ignore_errors=True)
                raise
    return ExportedPath.of(final, rows=splitter.rows, splits=splitter.splits)


def _tty() -> bool:
    import sys

    return sys.stderr.isatty()


def read_minari(
    root: str | Path | None,
    dataset_id: str,
    fields: Mapping[str, Any],
    *,
    trajectory_key: str | None = None,
    chunk: int = IMPORT_CHUNK,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> tuple[int, Iterator[dict[str, np.ndarray]]]:
    """The rows of the Minari dataset ``dataset_id`` for a table with ``fields``.

    Args:
        root: the datasets root; ``None``: Minari's (``MINARI_DATASETS_PATH``, else
            ``~/.minari/datasets``).
        dataset_id: the dataset's id.
        fields: the table's ``{dotted key: {"shape", "dtype"}}``.
        trajectory_key: a field to fill with each episode's id (when no info fills it).
        chunk: rows per chunk (episodes are cut across chunks where needed).
        max_batch_bytes: the most an Arrow batch or Parquet page may decompress to.

    Returns:
        The dataset's total steps, and an iterator of ``{dotted key: array}`` chunks.

    Raises:
        InvalidRequest: ``chunk`` or ``max_batch_bytes`` is not an integer >= 1; no such dataset under ``root``
            (the error lists those there), or its files are not a readable Minari dataset
            (metadata or an episode's data missing or malformed; while iterating too),
            or they reach outside its folder (:func:`~tdreplay.codec.dataset_links.check_inside`),
            or its files' episodes declare other sizes than its metadata's ``total_steps``
            (:func:`~tdreplay.codec.minari_hdf5.declared_steps`, ``arrow_steps``,
            ``parquet_steps``: read a chunk at a time, memory follows ``chunk``).
        SchemaError: (while iterating) see :func:`~tdreplay.codec.episodes.episode_rows`.
    """
    chunk, max_batch_bytes = import_chunk(chunk), import_batch_bytes(max_batch_bytes)
    _minari()
    from minari import MinariDataset

    root = default_root() if root is None else root
    folder = dataset_folder(root, dataset_id)
    if not (folder / "data").is_dir():
        there = _datasets_under(Path(root))
        listed = ", ".join(there[:LISTED]) or "none"
        if len(there) > LISTED:
            listed += f", and {len(there) - LISTED} more"
        raise InvalidRequest(
            f"no Minari dataset {dataset_id!r} under {str(root)!r} (there: {listed})",
            field="dataset_id",
            got=dataset_id,
        )
    check_inside(folder, dataset_id)
    try:  # Minari reads what the files hold, checking little: a bad one fails anywhere
        dataset = MinariDataset(folder / "data")
        total = int(dataset.total_steps)
        storage = dataset.storage
        data_format = storage.metadata.get("data_format")
        # sizes checked before a value is read (others: refused by MinariDataset)
        steps = {"hdf5": declared_steps, "arrow": arrow_steps, "parquet": parquet_steps}
        data = folder / "data" / MAIN_FILE if data_format == "hdf5" else folder / "data"
        steps[data_format](data, dataset_id, storage.total_episodes, total)
    except InvalidRequest:
        raise
    except Exception as err:
        raise unreadable(root, dataset_id, err) from None

    def episodes() -> Iterator[tuple[int, int, Any]]:
        spaces = (storage.observation_space, storage.action_space)
        how = (storage.total_episodes, spaces, storage.jpeg_encoding, chunk, fields)
        if data_format == "hdf5":
            read: Iterator[Any] = pieces(data, *how)
        else:  # a chunk at a time, as HDF5's; a compressed unit's size bounded
            files = arrow_pieces if data_format == "arrow" else parquet_pieces
            read = files(data, *how, max_batch_bytes)
        while True:
            try:
                piece = next(read, None)
            except SchemaError:
                raise
            except Exception as err:
                raise unreadable(root, dataset_id, err) from None
            if piece is None:
                return
            yield piece

    return total, table_rows(episodes(), fields, trajectory_key, chunk)


def _datasets_under(root: Path) -> list[str]:
    """The ids of the datasets under ``root`` (folders holding ``data/metadata.json``), for
    an error to list: a walk that neither follows links nor enters hidden folders or
    datasets, and skips what it cannot read (a root of ``/`` raised out of ``/proc``)."""
    found = []
    for folder, subfolders, _ in os.walk(root, onerror=lambda err: None):
        if "data" in subfolders and os.path.isfile(os.path.join(folder, "data", "metadata.json")):
            found.append(os.path.relpath(folder, root))
        subfolders[:] = [d for d in subfolders if d != "data" and not d.startswith(".")]
    return sorted(found)
