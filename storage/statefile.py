"""Table state on disk as JSON plus raw tensors: nothing in a state file can run code.

A table's state (``Table.state_dict()``: slot bookkeeping, sampler, writer and
rate-limiter state, the sampling generator's state) is a nest of dicts, lists,
numbers, strings and tensors. :func:`encode` splits it into a JSON-able
structure, where each tensor is replaced by ``{"__tensor__": name}``, and the
tensors themselves, ``{name: tensor}``; :func:`decode` puts them back together
and checks them. :func:`save_state` / :func:`load_state` keep both in one
`safetensors <https://github.com/huggingface/safetensors>`_ file,
``state.safetensors``: a JSON header (dtype, shape and byte range of every
tensor, plus our structure under ``__metadata__``) followed by the raw bytes.
Reading it parses JSON and copies bytes; there is no pickle anywhere
(unlike ``torch.save`` / ``torch.load(weights_only=False)``).

What is refused on load (:class:`StateError`): a file safetensors cannot parse
(sizes not matching the header, a truncated file, a header that is not JSON),
a dtype outside :data:`~tdreplay.codec.dtypes.TORCH`, a structure that is not
a JSON object of the expected kinds, a reference to a missing tensor, or a
tensor nothing refers to. Given the table's capacity, a tensor nothing refers to
and tensors larger than a table of that capacity keeps (:func:`max_state_elements`)
are refused from the file's header, before any is read (a state file may declare
gigabytes). The components then check what they are given (:func:`tensor`,
:func:`integer`, :func:`number`): a state of the wrong shape, dtype or range is
refused there, never copied in by broadcasting.

    >>> import tempfile, torch
    >>> state = {"slots": {"live": torch.tensor([True, False]), "hi": 1}, "generator": None}
    >>> structure, tensors = encode(state)
    >>> structure
    {'slots': {'live': {'__tensor__': 'slots.live'}, 'hi': 1}, 'generator': None}
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     _ = save_state(folder, state)
    ...     load_state(folder)["slots"]["live"].tolist()
    [True, False]
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import Any

import torch

from tdreplay.codec.dtypes import TORCH

#: the state file in a folder (a checkpoint, or a table's own folder)
STATE_FILE = "state.safetensors"
#: version of the structure kept under the file's ``__metadata__``: 2 numbers items by
#: ordinal (1 for the first, 0: never written), 1 by insert number (-1: never written)
STATE_FORMAT = 2
#: formats :func:`load_state` reads (older ones are upgraded as they are read)
READ_FORMATS = (1, 2)
#: marks a tensor reference in the JSON structure
TENSOR = "__tensor__"
#: the key of ``__metadata__`` (safetensors keeps ``{str: str}`` there) holding our JSON
_HEADER_KEY = "tdreplay.state"
#: dicts and lists nest no deeper than this (the table's state nests three levels)
_MAX_DEPTH = 32
#: the dtypes a state tensor may have: those of the table schema
ALLOWED_DTYPES = frozenset(TORCH.values())
#: state elements a table keeps per slot of its capacity, at most: 8 today (liveness,
#: ordinal, times sampled, priority, max-value key, an epoch's permutation and its
#: ordinals, episode id), with room to grow
ELEMENTS_PER_SLOT = 16
#: state elements besides, at most (the generator's 5,056 bytes)
FIXED_ELEMENTS = 1 << 16


def max_state_elements(capacity: int) -> tuple[int, int]:
    """The most elements one state tensor, and all of them together, of a table of
    ``capacity`` slots may hold (each element 8 bytes at most)."""
    return capacity + FIXED_ELEMENTS, ELEMENTS_PER_SLOT * capacity + FIXED_ELEMENTS


class StateError(ValueError):
    """A state (or state file) is malformed: wrong structure, dtype, shape or value.

    Checkpoint restore reports it as a :class:`~tdreplay.storage.CheckpointError`.
    """


# ---------------------------------------------------------------- structure <-> tensors
def encode(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Split ``state`` into a JSON-able structure and its tensors.

    Each tensor is replaced by ``{"__tensor__": name}``, ``name`` being its
    path joined with dots (``"slots.live"``); tuples become lists.

    Returns:
        ``(structure, {name: tensor})``; the tensors are contiguous CPU copies.

    Raises:
        StateError: a key is not a string or is ``"__tensor__"``, a value is of
            another type than dict, list, tuple, str, int, float, bool, None or
            tensor, a tensor's dtype is not allowed, or two paths give one name.
    """
    tensors: dict[str, torch.Tensor] = {}

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        where = ".".join(path) or "<state>"
        if isinstance(value, torch.Tensor):
            if value.dtype not in ALLOWED_DTYPES:
                raise StateError(f"{where}: tensors of dtype {value.dtype} cannot be saved")
            name = where
            if name in tensors:
                raise StateError(f"{where}: two tensors would be saved under one name")
            tensors[name] = value.detach().to("cpu", copy=True).contiguous()
            return {TENSOR: name}
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str) or key == TENSOR:
                    raise StateError(f"{where}: key {key!r} cannot be saved")
                out[key] = walk(item, (*path, key))
            return out
        if isinstance(value, list | tuple):
            return [walk(item, (*path, str(i))) for i, item in enumerate(value)]
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise StateError(f"{where}: a {type(value).__name__} cannot be saved")

    if not isinstance(state, dict):
        raise StateError(f"a state is a dict, got {type(state).__name__}")
    return walk(state, ()), tensors


def decode(structure: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Rebuild the state :func:`encode` split, checking every part.

    Raises:
        StateError: ``structure`` is not a dict of JSON values and tensor
            references, a reference names a missing tensor (or one already
            used), a tensor is not referred to, or a tensor's dtype is not allowed.
    """
    used: set[str] = set()

    def walk(value: Any, path: tuple[str, ...]) -> Any:
        where = ".".join(path) or "<state>"
        if len(path) > _MAX_DEPTH:
            raise StateError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
        if isinstance(value, dict):
            if TENSOR in value:
                name = value[TENSOR]
                if len(value) != 1 or not isinstance(name, str):
                    raise StateError(f"{where}: malformed tensor reference {value!r:.80}")
                if name not in tensors:
                    raise StateError(f"{where}: refers to tensor {name!r:.80}, which is missing")
                if name in used:
                    raise StateError(f"{where}: tensor {name!r:.80} is referred to twice")
                used.add(name)
                return tensors[name]
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):  # only possible from a caller, not from JSON
                    raise StateError(f"{where}: key {key!r:.80} is not a string")
                out[key] = walk(item, (*path, key))
            return out
        if isinstance(value, list):
            return [walk(item, (*path, str(i))) for i, item in enumerate(value)]
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise StateError(f"{where}: unexpected {type(value).__name__}")

    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise StateError(f"tensor {name!r:.80} is a {type(t).__name__}")
        if t.dtype not in ALLOWED_DTYPES:
            raise StateError(f"tensor {name!r:.80} has dtype {t.dtype}, which is not allowed")
    if not isinstance(structure, dict):
        raise StateError(f"the state is a JSON object, got {type(structure).__name__}")
    state = walk(structure, ())
    unused = sorted(set(tensors) - used)
    if unused:
        raise StateError(f"tensor {unused[0]!r:.80} is not part of the state")
    return state


# ---------------------------------------------------------------- files
def save_state(folder: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``<folder>/state.safetensors``, replacing it atomically.

    The file is written under a temporary name, flushed to disk, then renamed
    over the old one: a crash leaves the old state or the new one.

    Returns:
        The path of the file.

    Raises:
        StateError: ``state`` holds something :func:`encode` cannot save.
        OSError: the file could not be written.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    structure, tensors = encode(state)
    header = json.dumps({"format": STATE_FORMAT, "state": structure}, allow_nan=True)
    path = folder / STATE_FILE
    tmp = folder / f".{STATE_FILE}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        save_file(tensors, str(tmp), metadata={_HEADER_KEY: header})
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_state(folder: str | Path, *, capacity: int | None = None) -> dict[str, Any]:
    """Read the state :func:`save_state` wrote in ``folder``; nothing in the file can run code.

    Args:
        folder: the folder holding ``state.safetensors``.
        capacity: the table's capacity: tensors the state does not refer to, and
            tensors past :func:`max_state_elements`, are refused from the file's
            header, before any is read (``None``: no bound, for files of our own).

    Raises:
        StateError: the file is missing, is not a safetensors file, or holds a
            malformed state (see the module docstring); the message names the file
            (and the tensor at fault).
    """
    from safetensors import SafetensorError, safe_open

    path = Path(folder) / STATE_FILE
    if not path.is_file():
        raise StateError(f"{path} is missing")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            header = _header(path, f.metadata() or {})
            names = f.keys()
            if capacity is not None:
                shapes = {name: f.get_slice(name).get_shape() for name in names}
                _check_bounds(path, header.get("state"), shapes, capacity)
            # copies: the file may be replaced while the state is in use
            tensors = {name: f.get_tensor(name).clone() for name in names}
    except (SafetensorError, OSError, ValueError, TypeError, RuntimeError) as err:
        if isinstance(err, StateError):
            raise
        raise StateError(f"{path} is not a valid state file: {err}") from None
    try:
        state = decode(header.get("state"), tensors)
        return upgrade_v1(state) if header["format"] == 1 else state
    except StateError as err:
        raise StateError(f"{path}: {err}") from None


def _header(path: Path, metadata: dict[str, str]) -> dict[str, Any]:
    """Our JSON kept in the file's ``__metadata__``, of a format this reads."""
    try:
        header = json.loads(metadata[_HEADER_KEY])
    except KeyError:
        raise StateError(f"{path} holds no tdreplay state (no {_HEADER_KEY!r} metadata)") from None
    except (ValueError, RecursionError) as err:
        raise StateError(f"{path}: the state structure is not valid JSON: {err}") from None
    if not isinstance(header, dict) or header.get("format") not in READ_FORMATS:
        got = header.get("format") if isinstance(header, dict) else header
        raise StateError(
            f"{path}: state format {got!r:.80} not supported (expected one of {READ_FORMATS})"
        )
    return header


def _check_bounds(path: Path, structure: Any, shapes: dict[str, list[int]], capacity: int) -> None:
    """Refuse, from the header alone, tensors the state does not refer to and tensors
    more than a table of ``capacity`` slots keeps (see :func:`max_state_elements`)."""
    referred: set[str] = set()
    stack = [structure]
    while stack:  # no recursion: the structure is untrusted (decode bounds its depth)
        value = stack.pop()
        if isinstance(value, dict) and TENSOR in value:
            referred.add(str(value[TENSOR]))  # decode refuses a malformed one
        elif isinstance(value, dict | list):
            stack.extend(value.values() if isinstance(value, dict) else value)
    one, total = max_state_elements(capacity)
    held = 0
    for name, shape in shapes.items():
        if name not in referred:
            raise StateError(f"{path}: tensor {name!r:.80} is not part of the state")
        n = math.prod(shape)
        if n > one:
            raise StateError(
                f"{path}: tensor {name!r:.80} has shape {shape} ({n} elements); a table of "
                f"capacity {capacity} keeps at most {one} in one state tensor"
            )
        held += n
    if held > total:
        raise StateError(
            f"{path}: the state's tensors hold {held} elements; a table of capacity "
            f"{capacity} keeps at most {total}"
        )


def upgrade_v1(state: dict[str, Any]) -> dict[str, Any]:
    """A format-1 state in format 2: insert numbers (``seq``, -1: never written) become
    ordinals (``ordinal`` = insert number + 1, 0: never written), ``next_seq`` (inserts so
    far) becomes ``inserted``, the epoch's ``perm_seq`` ``perm_ordinal``. A part that is
    missing is left so; the components' checks then name it.

        >>> import torch
        >>> old = {"slots": {"seq": torch.tensor([-1, 0, 1]), "next_seq": 2}, "sampler": {}}
        >>> new = upgrade_v1(old)["slots"]
        >>> new["ordinal"].tolist(), new["inserted"]
        ([0, 1, 2], 2)
    """
    renames = {
        "slots": (("seq", "ordinal", 1), ("next_seq", "inserted", 0)),
        "sampler": (("perm_seq", "perm_ordinal", 1),),
    }
    for part, keys in renames.items():
        sub = state.get(part)
        if not isinstance(sub, dict):
            continue
        for old, new, shift in keys:
            if old in sub:
                value = sub.pop(old)
                if isinstance(value, torch.Tensor):
                    if value.dtype != torch.int64:
                        raise StateError(
                            f"{part}.{old}: expected dtype torch.int64, got {value.dtype}"
                        )
                    value = value + shift
                sub[new] = value
    return state


# ---------------------------------------------------------------- checks for load_state_dict
def _get(state: Any, key: str, where: str) -> Any:
    if not isinstance(state, dict):
        raise StateError(f"{where}: expected a dict, got {type(state).__name__}")
    if key not in state:
        raise StateError(f"{where}.{key} is missing")
    return state[key]


def tensor(
    state: Any,
    key: str,
    where: str,
    *,
    like: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    ndim: int | None = None,
) -> torch.Tensor:
    """``state[key]``, checked to be a tensor with ``like``'s dtype and shape (or ``dtype``/``ndim``).

    Raises:
        StateError: it is missing, not a tensor, or of another dtype or shape;
            the message names ``where.key``, what was expected and what came.
    """
    value = _get(state, key, where)
    if not isinstance(value, torch.Tensor):
        raise StateError(f"{where}.{key}: expected a tensor, got {type(value).__name__}")
    want_dtype = like.dtype if like is not None else dtype
    if want_dtype is not None and value.dtype != want_dtype:
        raise StateError(f"{where}.{key}: expected dtype {want_dtype}, got {value.dtype}")
    if like is not None and value.shape != like.shape:
        raise StateError(
            f"{where}.{key}: expected shape {list(like.shape)}, got {list(value.shape)}"
        )
    if ndim is not None and value.ndim != ndim:
        raise StateError(f"{where}.{key}: expected {ndim} dimension(s), got {list(value.shape)}")
    return value


def integer(state: Any, key: str, where: str, *, lo: int = 0, hi: int | None = None) -> int:
    """``state[key]``, checked to be an int (not a bool) in ``[lo, hi]``.

    Raises:
        StateError: it is missing, not an int, or out of range.
    """
    value = _get(state, key, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateError(f"{where}.{key}: expected an integer, got {value!r:.80}")
    if value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise StateError(f"{where}.{key}: expected an integer in {bound}, got {value}")
    return value


def number(state: Any, key: str, where: str, *, finite: bool = False) -> float:
    """``state[key]``, checked to be an int or float (not a bool); finite when asked.

    Raises:
        StateError: it is missing, not a number, or not finite when ``finite`` is set.
    """
    value = _get(state, key, where)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StateError(f"{where}.{key}: expected a number, got {value!r:.80}")
    if finite and not math.isfinite(value):
        raise StateError(f"{where}.{key}: expected a finite number, got {value}")
    return float(value)
