"""Reading a checkpoint folder's files without anything in them able to run code.

``TensorDict.load_memmap`` is not used: it unpickles a non-tensor entry's
``other.pickle`` (with only a ``FutureWarning`` in tensordict 0.14) and trusts
the dtype and shape each ``meta.json`` gives. Here every file is opened
without following a final symlink and must lie inside the checkpoint folder;
JSON files are parsed as JSON only; a row file (``<key>.memmap``) is mapped
copy-on-write only when the table's spec calls for it, with the dtype and
shape the spec gives, which its ``meta.json`` entry must repeat and its size
must match exactly. TorchRL's flat TED layout (``TED2Flat``) is read the same
way, its non-tensor entries (``is_full``, ``shift``, ``_storage_shape``) taken
from their ``meta.json`` as JSON values of the expected types.

Every problem found is an :class:`~tdreplay.storage.InvalidCheckpoint` naming
the file; a disk failure is a :class:`~tdreplay.storage.CheckpointError`.
(Like any memory map, a row file truncated by someone else while a restore
copies it faults the process; the checkpoint folder must not be writable by
those it is guarded from.)
"""

from __future__ import annotations

import json
import math
import mmap
import os
import stat
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from ..errors import CheckpointError, InvalidCheckpoint
from ..spec import NestedKey, TableSpec, join_key

#: a JSON file of a checkpoint larger than this is refused unread
MAX_JSON_BYTES = 16 << 20


def open_inside(src: Path, path: Path) -> int:
    """A read-only descriptor of the regular file ``path``, which must lie inside ``src``.

    A final symlink is not followed (``O_NOFOLLOW``) and a path leading out of
    the checkpoint through a linked folder is refused: a checkpoint must not
    make the server read (and then serve) another file of the host.
    """
    real = os.path.realpath(path)
    if not real.startswith(os.path.realpath(src) + os.sep):
        raise InvalidCheckpoint(f"{path} leads outside the checkpoint (to {real})")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InvalidCheckpoint(f"{path} is missing: the checkpoint is damaged") from None
    except OSError as err:
        if os.path.islink(path):
            raise InvalidCheckpoint(f"{path} is a symlink: refused") from None
        raise CheckpointError(f"cannot read {path}: {err.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidCheckpoint(f"{path} is not a regular file")
    return fd


def read_json(src: Path, path: Path) -> Any:
    """``path`` (inside ``src``) parsed as JSON, nothing else."""
    fd = open_inside(src, path)
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise InvalidCheckpoint(f"{path} is larger than {MAX_JSON_BYTES} bytes")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise InvalidCheckpoint(f"{path} is not valid JSON: {err}") from None


class StorageReader:
    """Reads leaves of a memmapped TensorDict folder (as ``TensorDict.memmap`` writes it) safely.

    A leaf ``("next", "reward")`` is the raw file ``next/reward.memmap``; its
    ``meta.json`` entry (``next/meta.json``, key ``"reward"``) must give the
    dtype and shape the caller expects, and the file must hold exactly that
    many bytes (``TensorDict.load_memmap`` would grow a truncated file with
    zeros: the rows would come back as zeros, and the checkpoint would change).
    The file is mapped copy-on-write: restoring never writes into it.
    """

    def __init__(self, src: Path, folder: Path) -> None:
        self.src, self.folder = src, folder
        self._metas: dict[Path, dict[str, Any]] = {}

    def _meta(self, folder: Path) -> dict[str, Any]:
        if folder not in self._metas:
            meta = read_json(self.src, folder / "meta.json")
            if not isinstance(meta, dict):
                raise InvalidCheckpoint(f"{folder / 'meta.json'} is not a JSON object")
            self._metas[folder] = meta
        return self._metas[folder]

    def entry(self, key: NestedKey) -> tuple[Path, dict[str, Any]]:
        """The folder holding leaf ``key`` and its ``meta.json`` entry."""
        folder = self.folder.joinpath(*key[:-1])
        entry = self._meta(folder).get(key[-1])
        if not isinstance(entry, dict):
            raise InvalidCheckpoint(
                f"{folder / 'meta.json'} has no entry for {join_key(key)!r}: the checkpoint is damaged"
            )
        return folder, entry

    def rows(self, key: NestedKey) -> int:
        """The number of rows ``meta.json`` gives leaf ``key`` (checked by :meth:`tensor`)."""
        folder, entry = self.entry(key)
        shape = entry.get("shape")
        if not (isinstance(shape, list) and shape and is_int(shape[0])):
            raise InvalidCheckpoint(f"{folder / 'meta.json'}: bad shape for {join_key(key)!r}")
        return shape[0]

    def tensor(self, key: NestedKey, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        """Leaf ``key``, which must have ``shape`` and ``dtype``."""
        folder, entry = self.entry(key)
        where = f"{folder / 'meta.json'}, entry {key[-1]!r}"
        got_shape, got_dtype = entry.get("shape"), entry.get("dtype")
        if got_dtype != str(dtype) or got_shape != shape or entry.get("is_nested", False):
            raise InvalidCheckpoint(
                f"{where}: dtype {got_dtype!r:.40} shape {got_shape!r:.80}, expected {dtype} "
                f"shape {shape} (from the checkpoint's spec)"
            )
        file = folder / f"{key[-1]}.memmap"
        numel = math.prod(shape)
        expected = numel * dtype.itemsize
        if not expected:
            return torch.empty(shape, dtype=dtype)  # tensordict writes no file for it
        fd = open_inside(self.src, file)
        try:
            got = os.fstat(fd).st_size
            if got != expected:
                raise InvalidCheckpoint(
                    f"{file} holds {got} bytes, expected {expected} bytes (shape {shape}, "
                    f"{dtype}): the checkpoint is truncated or damaged"
                )
            buf = mmap.mmap(fd, expected, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        return torch.frombuffer(buf, dtype=dtype, count=numel).view(shape)

    def non_tensor(self, key: str) -> Any:
        """The ``data`` of the non-tensor entry ``key`` (TED2Flat's ``is_full``, ...), as JSON."""
        meta = read_json(self.src, self.folder / key / "meta.json")
        if not isinstance(meta, dict) or "data" not in meta or not meta.get("_is_non_tensor"):
            raise InvalidCheckpoint(f"{self.folder / key / 'meta.json'} is not a non-tensor entry")
        return meta["data"]


def is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool`` (JSON's ``true`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def read_rows(src: Path, spec: TableSpec, hi: int) -> dict[NestedKey, torch.Tensor]:
    """The rows ``[0, hi)`` of every field from ``<src>/storage`` (the plain layout)."""
    reader = StorageReader(src, src / "storage")
    return {
        key: reader.tensor(key, [hi, *shape], dtype)
        for key, (shape, dtype) in spec.torch_schema().items()
    }


#: the flat keys TED2Flat takes from ``next`` (TorchRL's DEFAULT_DONE_KEYS and reward_keys)
_FROM_NEXT = {("done",), ("terminated",), ("truncated",), ("reward",)}


def flat_layout_fits(spec: TableSpec) -> bool:
    """Whether ``spec`` is a TED layout ``TED2Flat`` can flatten: a ``next.done`` field,
    and beside each other ``next`` field but the done and reward ones its root twin."""
    keys = spec.torch_schema().keys()
    return ("next", "done") in keys and all(
        k[1:] in keys or k[1:] in _FROM_NEXT for k in keys if k[0] == "next"
    )


def _read_flat(src: Path, spec: TableSpec, hi: int) -> TensorDict:
    """TorchRL's flat TED layout of ``<src>/storage``, as TED2Flat writes it, read safely.

    Flat keys are the root keys and the ``next`` keys with ``next`` dropped.
    Done and reward keys (taken from ``next``) and root-only keys hold ``hi``
    rows; a key both at the root and in ``next`` (an observation) holds ``hi``
    rows plus one per trajectory, the same number for every such key.
    """
    schema = spec.torch_schema()
    root = {k: v for k, v in schema.items() if k[0] != "next"}
    nxt = {k[1:]: v for k, v in schema.items() if k[0] == "next"}
    reader = StorageReader(src, src / "storage")
    flat: dict[NestedKey, torch.Tensor] = {}
    expanded_rows: int | None = None
    for key in sorted(root.keys() | nxt.keys()):
        if key in _FROM_NEXT and key in nxt:
            (shape, dtype), rows = nxt[key], hi
        elif key in root:
            (shape, dtype), rows = root[key], hi
            if key in nxt and key not in _FROM_NEXT:  # stored once, root and next together
                rows = reader.rows(key)
                if not hi < rows <= 2 * hi or rows != (expanded_rows or rows):
                    raise InvalidCheckpoint(
                        f"{src / 'storage'}: {join_key(key)!r} holds {rows} rows, expected "
                        f"{expanded_rows or f'between {hi + 1} and {2 * hi}'}"
                    )
                expanded_rows = rows
        else:
            raise InvalidCheckpoint(
                f"the spec of {src} has 'next.{join_key(key)}' without {join_key(key)!r}: "
                "not a TED layout TED2Flat could have written"
            )
        flat[key] = reader.tensor(key, [rows, *shape], dtype)
    is_full, shift = reader.non_tensor("is_full"), reader.non_tensor("shift")
    storage_shape = reader.non_tensor("_storage_shape")
    if not isinstance(is_full, bool):
        raise InvalidCheckpoint(f"{src / 'storage'}: is_full is {is_full!r:.40}, not a bool")
    if not is_int(shift) or not 0 <= shift <= spec.capacity:
        raise InvalidCheckpoint(
            f"{src / 'storage'}: shift is {shift!r:.40}, not an integer in [0, {spec.capacity}]"
        )
    if storage_shape != [hi]:
        raise InvalidCheckpoint(
            f"{src / 'storage'}: _storage_shape is {storage_shape!r:.40}, expected [{hi}]"
        )
    out = TensorDict({}, batch_size=[])
    for key, value in flat.items():
        out.set(key, value)
    out.set_non_tensor("is_full", is_full)
    out.set_non_tensor("shift", shift)
    out.set_non_tensor("_storage_shape", (hi,))
    return out


def load_flat(src: Path, spec: TableSpec, hi: int, like: TensorDict) -> TensorDict:
    """Rows ``[0, hi)`` of a TED2Flat checkpoint at ``src``, unflattened into ``like`` (a copy).

    The flat layout is read by :func:`_read_flat` (no unpickling), then turned
    back into TED rows with TorchRL's ``Flat2TED``.
    """
    from torchrl.data.replay_buffers.utils import Flat2TED

    flat = _read_flat(src, spec, hi)
    # Root done flags are not stored flat; they come back False, as a collector emits them.
    out = Flat2TED()(flat, like.clone().zero_())
    if not flat.get_non_tensor("is_full"):
        # Flat2TED skips the last row's next entries when the storage is not full
        # (TorchRL's last row is unwritten there); ours is written, and TED2Flat
        # stored its next entries last, as the final step closes a trajectory.
        nxt = out.get("next")
        for key in nxt.keys(True, True):
            value = flat.get(key, None)
            if value is not None and value.shape[0] > out.shape[0]:
                nxt.get(key)[-1] = value[-1]
    return out
