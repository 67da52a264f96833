"""A Minari Arrow dataset's episodes read a slice of steps at a time, their sizes checked first.

Minari's Arrow format keeps each episode in ``data/<id>/`` as Arrow IPC files (one record
batch of ``T + 1`` rows: actions, rewards and flags padded by one) beside the episode's
``metadata.json``. An IPC file may compress its batches: a few KB of zstd hold millions of
rows of zeros, and Minari's ``iterate_episodes`` decompressed each episode whole (and kept
only its first 131,072 rows, the scanner's first batch). Here, as for HDF5
(:mod:`tdreplay.codec.minari_hdf5`), memory follows the import's chunk:

What Minari's Parquet format shares with it (:mod:`tdreplay.codec.minari_parquet`): the
steps check (:func:`checked_steps`), the widths check (:func:`check_widths`) and the decoding
of an episode's batches (:func:`episode_pieces`).

* :func:`arrow_steps` counts each episode's rows from its files' message headers (the
  flatbuffers before each batch's body, never a value) and refuses a dataset whose steps
  disagree with an episode's ``total_steps`` or do not add up to the metadata's.
* :func:`arrow_pieces` checks each part's values per step, from the schema, against the
  table's fields (:func:`~tdreplay.codec.episode_rows.widths_fit`), and a compressed
  batch's size, from its buffers' headers, against the import's ``max_batch_bytes``
  (:data:`~tdreplay.codec.protocol.MAX_BATCH_BYTES`: pyarrow decompresses a batch whole); then
  reads the memory-mapped files :data:`READ_BYTES` at a time, decoded
  as Minari decodes them, JPEG frames checked from their headers (``_frames``).

The files are those :func:`~tdreplay.codec.dataset_links.check_inside` vetted: no link out.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from .episode_rows import widths_fit
from .episodes import ACTION, OBS
from .minari_hdf5 import (
    STEP_PARTS,
    _frames,
    _is_image_space,
    _refuse,
    check_total,
    rows_at_once,
)
from .protocol import MAX_BATCH_BYTES, over_batch_bytes

if TYPE_CHECKING:  # the datasets extra's: imported where a dataset is read (as Minari's own)
    import gymnasium as gym

__all__ = ["arrow_pieces", "arrow_steps", "check_widths", "checked_steps", "episode_pieces"]

MAGIC = b"ARROW1"
#: what Minari's reader skips in an episode's folder (``ignore_prefixes``)
SKIPPED = ("_", ".", "metadata.json")


def episode_files(data: Path, episode: int) -> list[Path]:
    """The IPC files of episode ``episode``, in the order pyarrow's discovery reads them."""
    folder = data / str(episode)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such episode folder")
    found = []
    for parent, subfolders, files in os.walk(folder):
        subfolders[:] = [d for d in subfolders if not d.startswith(SKIPPED)]
        found += [os.path.join(parent, f) for f in files if not f.startswith(SKIPPED)]
    return [Path(f) for f in sorted(found)]


def arrow_steps(data: Path, dataset_id: str, episodes: int, total_steps: int) -> None:
    """Refuse an Arrow dataset whose episodes hold other numbers of steps than its metadata
    (:func:`checked_steps`), counting rows from message headers only, never values."""
    checked_steps(
        data, dataset_id, episodes, total_steps, lambda f: sum(b.rows for b in _batches(f))
    )


def checked_steps(
    data: Path, dataset_id: str, episodes: int, total_steps: int, rows_of: Callable[[Path], int]
) -> None:
    """Refuse a dataset of one folder of files per episode (Minari's Arrow and Parquet
    formats) whose episodes hold other numbers of steps than its metadata says.

    Args:
        rows_of: a file's rows, from its headers or footer (never a value).

    Raises:
        InvalidRequest: an episode's rows (less the padding one) are not its
            ``metadata.json``'s ``total_steps``, or the episodes' steps do not add up to
            the dataset's (:func:`~tdreplay.codec.minari_hdf5.check_total`).
        OSError, ValueError: a file is not of the format (for the caller's ``unreadable``).
    """

    def counted() -> Iterator[tuple[int, str]]:
        for i in range(episodes):
            rows = sum(rows_of(f) for f in episode_files(data, i))
            t = max(rows - 1, 0)
            said = json.loads((data / str(i) / "metadata.json").read_text()).get("total_steps")
            if said is not None and int(said) != t:
                _refuse(
                    dataset_id,
                    f"{data / str(i)}: holds {t} steps but its metadata.json's total_steps "
                    f"says {int(said)}",
                )
            yield t, f"episode {i}"

    check_total(dataset_id, str(data), counted(), total_steps)


def arrow_pieces(
    data: Path,
    episodes: int,
    spaces: tuple[gym.Space, gym.Space],
    jpeg: bool,
    rows: int,
    fields: Mapping[str, Any],
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> Iterator[tuple[int, int, SimpleNamespace]]:
    """Each episode as pieces of at most ``rows`` steps (fewer where a step is wide:
    :data:`READ_BYTES` at a time), as :func:`~tdreplay.codec.minari_hdf5.pieces` yields them.

    Raises:
        SchemaError: a part's values per step disagree with the table's ``fields``
            (:func:`~tdreplay.codec.episode_rows.widths_fit`), before it is read.
        ValueError, TypeError, KeyError, OSError: the files are not Minari's layout, or a
            compressed batch decompresses to more than ``max_batch_bytes``.
    """
    for i in range(episodes):
        files = [
            (f, _batches(f), ipc.open_file(pa.memory_map(str(f)))) for f in episode_files(data, i)
        ]
        step = 1
        for path, batches, reader in files:
            check_widths(i, reader.schema, spaces, jpeg, fields)
            for n, b in enumerate(batches):
                if b.compressed and b.bytes > max_batch_bytes:
                    raise ValueError(
                        f"{path}: record batch {n} of {b.rows} rows decompresses to {b.bytes} "
                        f"bytes, {over_batch_bytes(max_batch_bytes)} (pyarrow decompresses a batch whole)"
                    )
                step = max(step, -(-b.bytes // max(b.rows, 1)))
        at_once = rows_at_once(rows, step)
        read = (r.get_batch(k) for _, _, r in files for k in range(r.num_record_batches))
        yield from episode_pieces(data / str(i), i, read, at_once, spaces, jpeg)


def check_widths(
    episode: int,
    schema: pa.Schema,
    spaces: tuple[gym.Space, gym.Space],
    jpeg: bool,
    fields: Mapping[str, Any],
) -> None:
    """Each part's values per step, from an episode's file's ``schema``, against the table's
    ``fields`` (:func:`~tdreplay.codec.episode_rows.widths_fit`); no value is read.

    Raises:
        SchemaError: a part's values per step disagree with the table's.
    """
    observation_space, action_space = spaces
    shapes = {
        **_shapes(schema.field("observations"), observation_space, jpeg, OBS),
        **_shapes(schema.field("actions"), action_space, jpeg, ACTION),
        **{v: _type_shape(schema.field(k)) for k, v in STEP_PARTS.items()},
    }
    info = schema.field("infos") if "infos" in schema.names else None
    for part in (shapes, _info_shapes(info.type, "") if info else {}):
        widths_fit(episode, part, fields)


def episode_pieces(
    folder: Path,
    episode: int,
    batches: Iterable[pa.RecordBatch],
    at_once: int,
    spaces: tuple[gym.Space, gym.Space],
    jpeg: bool,
) -> Iterator[tuple[int, int, SimpleNamespace]]:
    """An episode's record ``batches`` (its ``T + 1`` rows in order) as pieces of
    ``at_once`` steps, decoded as Minari's ``arrow_storage`` decodes them."""
    observation_space, action_space = spaces
    start = 0
    for window in _windows(batches, at_once):
        n = window.num_rows - 1  # the last row: the next piece's first observation
        where = f"{folder} steps {start}:{start + n}"
        piece = SimpleNamespace(
            observations=_decode(observation_space, window["observations"], jpeg, where),
            actions=_decode(action_space, window["actions"].slice(0, n), jpeg, where),
            infos=_info(window["infos"].slice(0, n)) if "infos" in window.column_names else {},
            **{k: _values(window[k].slice(0, n)) for k in STEP_PARTS},
        )
        yield episode, start, piece
        start += n


class _Batch(SimpleNamespace):
    rows: int
    bytes: int
    compressed: bool


def _batches(path: Path) -> list[_Batch]:
    """Each record batch's rows and bytes (decompressed), from its message header and its
    compressed buffers' length prefixes; no value is read."""
    source = pa.memory_map(str(path))
    if source.read(8)[:6] != MAGIC:
        raise ValueError(f"{path} is not an Arrow IPC file")
    reader = ipc.MessageReader.open_stream(source)
    found = []
    for message in reader:
        if message.type == "schema":
            continue
        if message.type != "record batch":
            raise ValueError(f"{path}: a {message.type} message (Minari writes none)")
        rows, buffers, compressed = _header(message.metadata.to_pybytes())
        body = message.body
        size = 0
        for offset, length in buffers:
            if compressed and length >= 8:
                said = struct.unpack_from("<q", body, offset)[0] if length else 0
                size += length - 8 if said == -1 else max(said, 0)
            else:
                size += length
        found.append(_Batch(rows=rows, bytes=size, compressed=compressed))
    return found


def _header(meta: bytes) -> tuple[int, list[tuple[int, int]], bool]:
    """A RecordBatch message's row count, buffers ``(offset, length)`` and whether its body
    is compressed, from the flatbuffer (``Message.fbs``: header -> RecordBatch)."""

    def field(table: int, n: int) -> int | None:
        vtable = table - struct.unpack_from("<i", meta, table)[0]
        size = struct.unpack_from("<H", meta, vtable)[0]
        at = struct.unpack_from("<H", meta, vtable + 4 + 2 * n)[0] if 4 + 2 * n < size else 0
        return table + at if at else None

    def deref(at: int) -> int:
        return at + struct.unpack_from("<I", meta, at)[0]

    header = field(deref(0), 2)
    if header is None:
        raise ValueError("a record batch message without a header")
    batch = deref(header)
    length, vec = field(batch, 0), field(batch, 2)
    rows = struct.unpack_from("<q", meta, length)[0] if length is not None else 0
    buffers = []
    if vec is not None:
        at = deref(vec)
        count = struct.unpack_from("<I", meta, at)[0]
        buffers = [struct.unpack_from("<qq", meta, at + 4 + 16 * k) for k in range(count)]
    if rows < 0 or any(o < 0 or n < 0 for o, n in buffers):
        raise ValueError(f"a record batch declaring {rows} rows or a negative buffer")
    return rows, buffers, field(batch, 3) is not None


def _windows(batches: Iterable[pa.RecordBatch], at_once: int) -> Iterator[pa.Table]:
    """The episode's rows as tables of ``at_once + 1`` rows (the last fewer), each starting
    at the previous one's last row; at most two batches held."""
    pending: pa.Table | None = None
    for batch in batches:
        batch.validate()
        table = pa.Table.from_batches([batch])
        pending = table if pending is None else pa.concat_tables([pending, table])
        while pending.num_rows > at_once + 1:
            yield pending.slice(0, at_once + 1)
            pending = pending.slice(at_once)
    if pending is not None and pending.num_rows > 1:
        yield pending


def _type_shape(field: pa.Field) -> tuple[int, ...]:
    """Values per step of a column, from its type (a string's or binary's: ragged, one)."""
    shape: list[int] = []
    kind = field.type
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind = kind.value_type
    return tuple(shape)


def _shapes(field: pa.Field, space: gym.Space, jpeg: bool, prefix: str) -> dict[str, Any]:
    """:func:`_type_shape` of each column under ``field``, by its dotted key (a JPEG
    frame's: its space's, what ``_frames`` checks each against)."""
    from gymnasium import spaces

    if isinstance(space, (spaces.Dict, spaces.Tuple)):  # Minari's struct of the subspaces
        dict_space = isinstance(space, spaces.Dict)
        names = space.spaces if dict_space else range(len(space.spaces))
        kids = {str(k): space.spaces[k] for k in names}  # type: ignore[index]
        found: dict[str, Any] = {}
        for child in field.type:
            if child.name in kids:  # what Minari decodes: the space's
                key = f"{prefix}.{child.name}" if dict_space else f"{prefix}._{child.name}"
                found |= _shapes(child, kids[child.name], jpeg, key)
        return found
    if jpeg and _is_image_space(space):
        return {prefix: tuple(space.shape or ())}
    return {prefix: _type_shape(field)}


def _info_shapes(kind: pa.DataType, prefix: str) -> dict[str, tuple[int, ...]]:
    found: dict[str, tuple[int, ...]] = {}
    for child in kind:
        key = f"{prefix}{child.name}"
        if pa.types.is_struct(child.type):
            found |= _info_shapes(child.type, f"{key}.")
        else:
            found[key] = _type_shape(child)
    return found


def _values(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column's values, ``(rows, *per step)``."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    shape = _type_shape(pa.field("", array.type))
    for _ in shape:
        array = array.flatten()
    values = array.to_numpy(zero_copy_only=False)
    return values.reshape(-1, *shape) if shape else values


def _decode(space: gym.Space, column: pa.ChunkedArray | pa.Array, jpeg: bool, where: str) -> Any:
    """Rows of a column decoded as Minari's ``arrow_storage._decode_space`` decodes them."""
    from gymnasium import spaces

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(space, spaces.Dict):
        return {k: _decode(s, array.field(k), jpeg, where) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(
            _decode(s, array.field(str(k)), jpeg, where) for k, s in enumerate(space.spaces)
        )
    if jpeg and _is_image_space(space):
        frames = array.to_numpy(zero_copy_only=False)
        return _frames(frames, tuple(space.shape or ()), where)
    if isinstance(space, (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)):
        if not pa.types.is_fixed_size_list(array.type):
            raise TypeError(f"a {type(space).__name__} space's column is {array.type}")
        return array.flatten().to_numpy(zero_copy_only=False).reshape(-1, *space.shape)
    if isinstance(space, spaces.Discrete):
        return array.to_numpy(zero_copy_only=False)
    return array.to_pylist()


def _info(column: pa.ChunkedArray | pa.Array) -> dict[str, Any]:
    """Infos decoded as Minari's ``_decode_info`` (a ``shape`` in a field's metadata: the
    values' shape per step; an empty one: a scalar)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    found: dict[str, Any] = {}
    for k, child in enumerate(array.type):
        values = array.field(k)
        if pa.types.is_struct(child.type):
            found[child.name] = _info(values)
            continue
        value = _values(values)
        said = (child.metadata or {}).get(b"shape")
        if said is not None:
            value = value.reshape(len(value), *(int(d) for d in said.split(b",") if d))
        found[child.name] = value
    return found
