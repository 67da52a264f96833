"""A Minari HDF5 dataset's episodes read a slice of steps at a time, their sizes checked first.

HDF5 stores a dataset's declared shape apart from its values: a file of a few KB can
declare an episode of 500M steps whose datasets were never written (HDF5 reads them as
zeros), and Minari's ``iterate_episodes`` reads each episode whole, so memory followed
what the file declared (80 GB for that one). Here memory follows the import's chunk:

* :func:`declared_steps` checks, from the shapes alone, that the episodes' steps
  (their ``rewards``) add up to the metadata's ``total_steps`` (the progress total, and
  what the dataset says it is) and that each matches its own ``total_steps`` attribute
  where Minari wrote one; a file that disagrees is refused before a value is read.
* :func:`pieces` reads each episode ``rows`` steps at a time (``dset[i:j]`` through h5py,
  on the file :func:`~tdreplay.codec.dataset_links.check_inside` vetted), decoded as
  Minari decodes them (``Dict`` / ``Tuple`` groups, ``Text``, JPEG frames), after
  checking every part's length against the episode's steps (the check
  :func:`~tdreplay.codec.episode_rows.episode_rows` makes of a whole episode), and its
  values per step against the table's field (:func:`~tdreplay.codec.episode_rows.widths_fit`:
  a file declares any width) and each JPEG frame's size against its space, from its header.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from .episode_rows import episode_rows, lengths_fit, widths_fit
from .episodes import ACTION, OBS, REWARD, TERMINATED, TRUNCATED
from .errors import InvalidRequest
from .protocol import READ_BYTES

if TYPE_CHECKING:  # the datasets extra's: imported where a dataset is read (as Minari's own)
    import gymnasium as gym

__all__ = [
    "MAIN_FILE",
    "check_total",
    "declared_steps",
    "pieces",
    "rows_at_once",
    "table_rows",
    "unreadable",
]

#: the file of Minari's HDF5 format
MAIN_FILE = "main_data.hdf5"
#: the per-step parts of an episode besides its observations, actions and infos, and the
#: fields they feed
STEP_PARTS = {"rewards": REWARD, "terminations": TERMINATED, "truncations": TRUNCATED}


def rows_at_once(rows: int, step: int) -> int:
    """Steps read at a time: ``rows`` (the chunk), fewer where a step of ``step`` bytes is
    wide (:data:`READ_BYTES` at a time), at least one.

        >>> rows_at_once(4096, 8), rows_at_once(4096, 1 << 20), rows_at_once(4096, 1 << 30)
        (4096, 32, 1)
    """
    return max(1, min(rows, READ_BYTES // max(step, 1)))


def unreadable(root: str | Path, dataset_id: str, err: Exception) -> InvalidRequest:
    """The error for a dataset whose files are not a readable Minari dataset."""
    return InvalidRequest(
        f"{dataset_id!r} under {str(root)!r} is not a readable Minari dataset: "
        f"{type(err).__name__}: {err}",
        field="dataset_id",
        got=dataset_id,
    )


def declared_steps(path: Path, dataset_id: str, episodes: int, total_steps: int) -> None:
    """Refuse an HDF5 file whose episodes declare other sizes than the dataset's metadata.

    Reads shapes and attributes only, never values.

    Raises:
        InvalidRequest: the steps (``rewards``) of episodes ``0 .. episodes - 1`` do not
            add up to ``total_steps``, or an episode's ``total_steps`` attribute is not its
            number of rewards (the error names the file, the episode and both numbers).
        KeyError, TypeError, OSError: the file lacks an episode or its rewards (for the
            caller's :func:`unreadable`).
    """
    with h5py.File(path, "r") as f:

        def counted() -> Iterator[tuple[int, str]]:
            for i in range(episodes):
                group = f[f"episode_{i}"]
                t = _length(group["rewards"])
                said = group.attrs.get("total_steps")
                if said is not None and int(said) != t:
                    _refuse(
                        dataset_id,
                        f"{path}: episode_{i} holds {t} rewards but its total_steps attribute "
                        f"says {int(said)}",
                    )
                yield t, f"episode_{i}"

        check_total(dataset_id, str(path), counted(), total_steps)


def check_total(
    dataset_id: str, where: str, counted: Iterable[tuple[int, str]], total_steps: int
) -> None:
    """Refuse episodes whose steps do not add up to the dataset's ``total_steps`` (the one
    check of every Minari format; ``counted``: each episode's steps and name, from shapes,
    headers or footers, never values).

        >>> check_total("d", "data", [(3, "episode_0"), (2, "episode_1")], 5)

    Raises:
        InvalidRequest: they do not (the error names ``where``, the longest episode and
            both numbers).
    """
    steps, n, largest = 0, 0, (0, -1, "")
    for i, (t, name) in enumerate(counted):
        steps, n, largest = steps + t, n + 1, max(largest, (t, i, name))
    if steps != total_steps:
        _refuse(
            dataset_id,
            f"{where}: its {n} episodes hold {steps} steps (the longest, {largest[2]}: "
            f"{largest[0]}) but metadata.json's total_steps is {total_steps}",
        )


def pieces(
    path: Path,
    episodes: int,
    spaces: tuple[gym.Space, gym.Space],
    jpeg: bool,
    rows: int,
    fields: Mapping[str, Any],
) -> Iterator[tuple[int, int, SimpleNamespace]]:
    """Each episode of the file as pieces of at most ``rows`` steps (fewer where a step is
    wide: :data:`READ_BYTES` of values at a time).

    Yields ``(episode id, first step, piece)``: a piece has Minari's ``EpisodeData``
    attributes (``observations`` one longer than ``rewards``, ``infos`` of the parts of
    ``T`` or ``T + 1`` values), for :func:`~tdreplay.codec.episode_rows.episode_rows`.

    Raises:
        SchemaError: an episode's parts disagree in length, or in values per step with the
            table's ``fields`` (:func:`~tdreplay.codec.episode_rows.widths_fit`), before it
            is read.
        KeyError, TypeError, ValueError, OSError: the file is not Minari's layout.
    """
    observation_space, action_space = spaces
    with h5py.File(path, "r") as f:
        for i in range(episodes):
            group = f[f"episode_{i}"]
            # each object looked up once: h5py's lookups were most of an honest import's time
            obs, acts = group["observations"], group["actions"]
            steps = {k: group[k] for k in STEP_PARTS}
            t = _length(steps["rewards"])
            lengths_fit(
                i,
                t,
                {
                    "observations": (_lengths(obs, OBS), t + 1),
                    "actions": (_lengths(acts, ACTION), t),
                    **{k: ({k: _length(steps[k])}, t) for k in ("terminations", "truncations")},
                },
            )
            infos = _info_leaves(group["infos"], t) if "infos" in group else {}
            shapes = {
                **_shapes(obs, observation_space, jpeg, OBS),
                **_shapes(acts, action_space, jpeg, ACTION),
                **{STEP_PARTS[k]: _shape(v) for k, v in steps.items()},
            }
            info_shapes = {k.replace("/", "."): _shape(v) for k, v in infos.items()}
            step = 0
            for part in (shapes, info_shapes):  # an info may share a key: both are read
                widths_fit(i, {k: s for k, (s, _) in part.items()}, fields)
                step += sum(math.prod(s) * n for s, n in part.values())
            at_once = rows_at_once(rows, step)
            start = 0
            while start < t:
                end = min(t, start + at_once)
                piece = SimpleNamespace(
                    observations=_decode(obs, observation_space, jpeg, start, end + 1),
                    actions=_decode(acts, action_space, jpeg, start, end),
                    infos=_nest({k: v[start:end] for k, v in infos.items()}),
                    **{k: v[start:end] for k, v in steps.items()},
                )
                yield i, start, piece
                start = end


def table_rows(
    pieces: Iterable[tuple[int, int, Any]],
    fields: Mapping[str, Any],
    trajectory_key: str | None,
    chunk: int,
) -> Iterator[dict[str, np.ndarray]]:
    """The rows of ``(episode id, first step, episode or piece)`` for a table with ``fields``
    (:func:`~tdreplay.codec.episode_rows.episode_rows`), in chunks of ``chunk`` rows (the
    last may hold fewer), episodes cut across chunks where needed."""
    held: list[dict[str, np.ndarray]] = []
    count = 0
    for episode_id, first, episode in pieces:
        held.append(episode_rows(fields, episode, episode_id, trajectory_key, first_step=first))
        count += len(episode.rewards)
        while count >= chunk:
            rows = {k: np.concatenate([h[k] for h in held]) for k in held[0]}
            yield {k: v[:chunk] for k, v in rows.items()}
            held = [{k: v[chunk:] for k, v in rows.items()}]
            count -= chunk
    if count:
        yield {k: np.concatenate([h[k] for h in held]) for k in held[0]}


def _length(ref: Any) -> int:
    if not isinstance(ref, h5py.Dataset):
        raise TypeError(f"{ref.name} is not a dataset")
    if not ref.shape:
        raise TypeError(f"{ref.name} holds a single value, not one per step")
    return int(ref.shape[0])


def _shape(ref: h5py.Dataset) -> tuple[tuple[int, ...], int]:
    """A dataset's shape per step and bytes per value (a string's or JPEG's: ragged, not
    declared, so counted as one value of one byte)."""
    dtype = ref.dtype  # an h5py property that asks the file each time
    if dtype.kind in "OSUV":
        return (), 1
    return tuple(ref.shape[1:]), dtype.itemsize


def _shapes(
    ref: Any, space: gym.Space, jpeg: bool, prefix: str
) -> dict[str, tuple[tuple[int, ...], int]]:
    """:func:`_shape` of each dataset under ``ref``, by the dotted key ``episode_rows`` gives
    it; a JPEG frame's is its space's (what a frame must decode to, :func:`_frames`)."""
    from gymnasium import spaces  # the datasets extra (as in _decode)

    if isinstance(space, spaces.Tuple):
        return {
            k: v
            for n in range(len(ref.keys()))
            for k, v in _shapes(ref[f"_index_{n}"], space.spaces[n], jpeg, f"{prefix}._{n}").items()
        }
    if isinstance(space, spaces.Dict):
        return {
            k: v
            for name in ref
            for k, v in _shapes(ref[name], space.spaces[name], jpeg, f"{prefix}.{name}").items()
        }
    if not isinstance(ref, h5py.Dataset):
        raise TypeError(f"{ref.name} is not a dataset")
    if jpeg and _is_image_space(space):
        return {prefix: (tuple(space.shape or ()), 1)}
    return {prefix: _shape(ref)}


def _lengths(ref: Any, prefix: str) -> dict[str, int]:
    """The length of each dataset under ``ref``, by the dotted key ``episode_rows`` gives it."""
    if isinstance(ref, h5py.Group):
        return {k: n for name in ref for k, n in _lengths(ref[name], f"{prefix}.{name}").items()}
    return {prefix: _length(ref)}


def _info_leaves(group: h5py.Group, t: int) -> dict[str, h5py.Dataset]:
    """The info datasets of ``T`` or ``T + 1`` values (the others ``episode_rows`` drops)."""
    found: dict[str, h5py.Dataset] = {}
    for name, ref in group.items():
        if isinstance(ref, h5py.Group):
            found |= {f"{name}/{k}": v for k, v in _info_leaves(ref, t).items()}
        elif not isinstance(ref, h5py.Dataset):
            raise ValueError("Infos are in an unsupported format")
        elif ref.shape and ref.shape[0] in (t, t + 1):
            found[name] = ref
    return found


def _nest(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        *path, last = key.split("/")
        node = tree
        for name in path:
            node = node.setdefault(name, {})
        node[last] = value
    return tree


def _decode(ref: Any, space: gym.Space, jpeg: bool, start: int, end: int) -> Any:
    """Steps ``start:end`` of ``ref``, decoded as Minari's ``HDF5Storage._decode_space``."""
    from gymnasium import spaces  # the datasets extra (as _frames' PIL, Minari's)

    if isinstance(space, spaces.Tuple):
        return tuple(
            _decode(ref[f"_index_{k}"], space.spaces[k], jpeg, start, end)
            for k in range(len(ref.keys()))
        )
    if isinstance(space, spaces.Dict):
        return {k: _decode(ref[k], space.spaces[k], jpeg, start, end) for k in ref}
    if not isinstance(ref, h5py.Dataset):
        raise TypeError(f"{ref.name} is not a dataset")
    if isinstance(space, spaces.Text):
        return [s.decode("utf-8") for s in ref[start:end]]
    if jpeg and _is_image_space(space):
        return _frames(ref[start:end], tuple(space.shape or ()), f"{ref.name}[{start}:{end}]")
    return ref[start:end]


def _frames(jpeg_bytes: np.ndarray, shape: tuple[int, ...], where: str) -> np.ndarray:
    """JPEG frames decoded, each checked from its header against the space's ``shape`` (the
    table's field's, :func:`_shapes`) before it is decoded: a few KB of JPEG can declare
    65,500 x 65,500 pixels (12 GB decoded).

    Raises:
        ValueError: a frame is of another size or mode (for the caller's ``unreadable``).
    """
    from PIL import Image  # Minari's dependency, as its JPEG decoding

    frames = np.empty((len(jpeg_bytes), *shape), dtype=np.uint8)
    for n, b in enumerate(jpeg_bytes):
        with Image.open(io.BytesIO(b)) as image:
            got = (image.height, image.width, *([len(image.getbands())] * (len(shape) > 2)))
            if got != shape:
                raise ValueError(
                    f"{where}: JPEG frame {n} is {image.width} x {image.height} "
                    f"{image.mode} ({got}), but the space's frames are {shape}"
                )
            frames[n] = np.asarray(image, dtype=np.uint8)
    return frames


def _is_image_space(space: gym.Space) -> bool:
    from minari.dataset.minari_storage import is_image_space

    return bool(is_image_space(space))


def _refuse(dataset_id: str, why: str) -> None:
    raise InvalidRequest(
        f"the Minari dataset {dataset_id!r} declares sizes its metadata does not: {why}",
        field="dataset_id",
        got=dataset_id,
    )
