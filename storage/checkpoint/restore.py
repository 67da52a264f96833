"""Restoring a table from a checkpoint, with nothing read from it able to run code.

A checkpoint folder is as untrusted as a request body. ``metadata.json`` is
parsed as JSON, the state file holds JSON and raw tensors
(:mod:`~tdreplay.storage.statefile`), and the rows are read by
:mod:`~tdreplay.storage.checkpoint.reader`, not ``TensorDict.load_memmap``
(which unpickles a non-tensor entry's ``other.pickle``): only the ``.memmap``
files the spec calls for, with the spec's dtypes and shapes, every
``meta.json`` as JSON.

Format 1 checkpoints (``state.pt``, written with ``torch.save``) are still
restored: their state is read with ``torch.load(weights_only=True)``, which
only rebuilds tensors and plain containers and refuses anything else, then
checked like a format 2 state; the rows are read as above. Checkpointing the
restored table writes format 2.

The rows are held to what an extend is: a field that declares ``n`` categories
holds values ``0 .. n-1`` only (:func:`tdreplay.codec.spaces.outside_categories`,
the test an extend runs).

A damaged, unsupported or unsafe checkpoint is refused with
:class:`~tdreplay.storage.InvalidCheckpoint` (a :class:`CheckpointError`),
whose message names the file and the problem; nothing of it was loaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from tdreplay.codec.spaces import outside_categories

from .. import statefile as SF
from ..backends import allocate, primary_location, sweep
from ..errors import CheckpointError, InvalidCheckpoint, TDReplayError
from ..redis_conn import Connections
from ..spec import (
    MaxValueWriterSpec,
    NestedKey,
    SliceSamplerSpec,
    TableSpec,
    join_key,
    split_key,
)
from ..tensordicts import leaves, nest
from . import reader as R
from .folder import (
    METADATA,
    READABLE_FORMATS,
    V1_STATE,
    find,
    overlaps,
    path_lock,
    read_metadata,
)

if TYPE_CHECKING:
    from ..consumers import Restorable

T = TypeVar("T", bound="Restorable")


def restore(
    cls: Callable[..., T],
    path: Path,
    root: str | Path | None,
    *,
    seed: int | None = None,
    redis: Connections | None = None,
    expect: TableSpec | None = None,
) -> T:
    """Rebuild a table from the checkpoint at ``path`` (see :meth:`Table.restore`).

    Rows and state are read and checked first (see the module docstring: nothing
    read can run code). The table is then allocated beside whatever exists at
    its location, never over it, and both are loaded into it; if that fails it
    is destroyed (its own, fresh location only) and the error raised.

    Raises:
        CheckpointError: no checkpoint at ``path``, the table's data would go
            inside it, or a file could not be read (a disk error).
        InvalidCheckpoint: the checkpoint is damaged, of an unsupported format,
            or holds something unsafe to load; the message names the file.
        SchemaError: the spec in ``metadata.json`` is invalid.
    """
    # A checkpoint written to ``path`` meanwhile would give this read the metadata and
    # rows of one checkpoint and the state of the next: the two are serialized.
    with path_lock(path.absolute()):
        src, spec, root, hi, rows, slots, state = _read(path.absolute(), root, expect)
    # Nothing that exists is deleted or overwritten until the table is whole: a
    # table being served may live at the default location (see backends.locations).
    table = cls(spec, allocate(spec, root, exists="beside", redis=redis), root=root, seed=seed)
    try:
        if rows is not None:
            where = slice(0, hi) if slots is None else slots
            table.backend.write(where, {k: v.contiguous() for k, v in rows.items()})
        _check_table_state(table, state, hi)
        table.load_state_dict(state)
        if rows is not None:
            _check_ranks(spec, state, _Columns(rows, slots, hi))
            _check_episodes(spec, state, _Columns(rows, slots, hi))
    except Exception as err:
        table.destroy()
        if isinstance(err, TDReplayError):
            raise
        raise _invalid(src, err, spec.name) from err
    sweep(spec, root)
    return table


def _read(
    path: Path, root: str | Path | None, expect: TableSpec | None
) -> tuple[
    Path,
    TableSpec,
    Path,
    int,
    dict[NestedKey, torch.Tensor] | None,
    torch.Tensor | None,
    dict[str, Any],
]:
    """The checkpoint at ``path``, read and checked: where it was found (:func:`find`), its
    spec, the data root of the table
    (``root``, default the checkpoint's parent), ``hi``, its rows (``None``: none) mapped
    copy-on-write, the slots they are (``None``: ``[0, hi)``; ``live_only``: the live ones),
    and its state (see :func:`restore`)."""
    src = find(path)
    meta = read_metadata(src)
    version = meta.get("format_version")
    if not R.is_int(version) or version not in READABLE_FORMATS:
        raise InvalidCheckpoint(
            f"{src}: checkpoint format {version!r:.40} not supported (this tdreplay reads "
            f"formats {', '.join(map(str, READABLE_FORMATS))}); restore it with the tdreplay "
            "that wrote it and checkpoint it again"
        )
    if not isinstance(meta.get("spec"), dict):
        raise InvalidCheckpoint(f"{src / METADATA}: 'spec' is missing or not an object")
    spec = TableSpec.parse(meta["spec"], source=str(src / METADATA))
    if expect is not None and spec != expect:
        # The caller checked ``expect`` (name, backend, limits); this is the read that counts.
        raise InvalidCheckpoint(
            f"{src / METADATA} changed while it was being restored; nothing was restored",
            table=expect.name,
        )
    hi, ted2flat = meta.get("hi"), meta.get("ted2flat", False)
    if not isinstance(hi, int) or isinstance(hi, bool) or not 0 <= hi <= spec.capacity:
        raise InvalidCheckpoint(
            f"{src / METADATA}: 'hi' is {hi!r:.40}, not an integer in [0, {spec.capacity}]"
        )
    if not isinstance(ted2flat, bool):
        raise InvalidCheckpoint(f"{src / METADATA}: 'ted2flat' is {ted2flat!r:.40}, not a bool")
    live_only = meta.get("live_only", False)
    if not isinstance(live_only, bool) or (live_only and ted2flat):
        raise InvalidCheckpoint(
            f"{src / METADATA}: 'live_only' is {live_only!r:.40}, not a bool (false with ted2flat)"
        )
    root = Path(root) if root is not None else src.parent
    location = primary_location(spec, root)
    if location is not None and overlaps(location, src):
        # Allocating there would wipe (memmap) or write into the checkpoint being read.
        raise CheckpointError(
            f"cannot restore {src} under root {root}: the table's data would go to {location}, "
            "inside the checkpoint; pass another root",
            table=spec.name,
        )
    # Everything is read and checked before a table is allocated.
    try:
        rows = slots = None
        state = _read_state(src, version, spec.capacity)
        if hi and live_only:
            slots = _live_slots(state, hi, spec.capacity)
            if slots is not None and len(slots):
                rows = R.read_rows(src, spec, len(slots))
        elif hi and ted2flat:
            schema = spec.torch_schema()
            empty = {k: torch.empty([hi, *shape], dtype=d) for k, (shape, d) in schema.items()}
            got = leaves(R.load_flat(src, spec, hi, nest(empty, hi)))
            rows = {k: torch.as_tensor(got[k]) for k in schema}
        elif hi:
            rows = R.read_rows(src, spec, hi)
        if rows is not None:
            _check_categories(spec, rows, slots)
    except InvalidCheckpoint as err:
        raise InvalidCheckpoint(
            f"cannot restore {src}: {err}",
            table=spec.name,
            field=err.field,
            expected=err.expected,
            got=err.got,
        ) from None
    except TDReplayError:
        raise
    except Exception as err:
        raise _invalid(src, err, spec.name) from err
    return src, spec, root, hi, rows, slots, state


def _live_slots(state: dict[str, Any], hi: int, capacity: int) -> torch.Tensor | None:
    """The slots whose rows a ``live_only`` checkpoint holds: those live in its state.
    ``None`` where its ``slots.live`` has neither ``hi`` nor ``capacity`` rows: the state's
    load refuses it then, with the rest of the state's checks, naming it."""
    slots = state.get("slots")
    if not isinstance(slots, dict):
        raise SF.StateError(f"slots: expected a dict, got {type(slots).__name__}")
    live = SF.tensor(slots, "live", "slots", dtype=torch.bool, ndim=1)
    if len(live) not in (hi, capacity):
        return None
    return live[:hi].nonzero().squeeze(1)


class _Columns:
    """A field of the restored rows by slot over ``[0, hi)``: rows given for ``slots`` only
    (``live_only``) read as zeros elsewhere (the checks read live slots only)."""

    def __init__(
        self, rows: dict[NestedKey, torch.Tensor], slots: torch.Tensor | None, hi: int
    ) -> None:
        self.rows, self.slots, self.hi = rows, slots, hi

    def __getitem__(self, key: NestedKey) -> torch.Tensor:
        value = self.rows[key].reshape(len(self.rows[key]))
        if self.slots is None:
            return value
        out = torch.zeros(self.hi, dtype=value.dtype)
        out[self.slots] = value
        return out


def _check_categories(
    spec: TableSpec, rows: dict[NestedKey, torch.Tensor], slots: torch.Tensor | None
) -> None:
    """The checkpoint's rows hold no value an extend refuses for a field's categories."""
    for key, n in spec.categories().items():
        found = outside_categories(rows[key].numpy(), n)
        if found is not None:
            slot, value = found
            slot = slot if slots is None else int(slots[slot])
            raise InvalidCheckpoint(
                f"field {join_key(key)!r} holds {value} in slot {slot}, outside its {n} "
                f"categories 0 .. {n - 1}",
                field=join_key(key),
                expected=f"0 .. {n - 1}",
                got=value,
            )


def _invalid(src: Path, err: Exception, table: str) -> CheckpointError:
    """``err`` raised while reading ``src``, as the error restore reports."""
    if isinstance(err, OSError) and not isinstance(err, FileNotFoundError):
        # the disk failed, not the checkpoint
        return CheckpointError(f"cannot restore {src}: {err}", table=table)
    return InvalidCheckpoint(f"cannot restore {src}: {err}", table=table)


def _read_state(src: Path, version: int, capacity: int) -> dict[str, Any]:
    """The table state of a checkpoint: JSON + raw tensors (format 2), or ``weights_only``
    (1), no larger than a table of ``capacity`` keeps (checked before it is read)."""
    if version >= 2:
        if os.path.lexists(src / V1_STATE):
            # Never written beside a format 2 state: planted, or two checkpoints mixed up.
            raise InvalidCheckpoint(
                f"it holds {V1_STATE}, which a format {version} checkpoint never has "
                "(a planted or mixed-up file); refused"
            )
        os.close(R.open_inside(src, src / SF.STATE_FILE))  # a regular file inside the checkpoint
        return SF.load_state(src, capacity=capacity)
    path = src / V1_STATE
    os.close(R.open_inside(src, path))
    # torch.save stores tensors' bytes uncompressed: the file's size bounds what it loads
    limit = 8 * SF.max_state_elements(capacity)[1] + (1 << 20)  # + the pickled structure
    if path.stat().st_size > limit:
        raise InvalidCheckpoint(
            f"{path.name} (format 1) holds {path.stat().st_size} bytes; the state of a table "
            f"of capacity {capacity} takes at most {limit}"
        )
    try:
        # weights_only: tensors and plain containers only; anything else is refused unrun.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise InvalidCheckpoint(
            f"{path.name} (format 1) cannot be read safely: "
            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
        ) from None
    structure, tensors = SF.encode(state)  # the same checks as a format 2 state
    return SF.decode(structure, tensors)


def _check_table_state(table: Restorable, state: dict[str, Any], hi: int) -> None:
    """Check the table-level parts of ``state`` (the components check their own)."""
    for part in ("slots", "sampler", "writer", "rate_limiter"):
        if not isinstance(state.get(part), dict):
            raise SF.StateError(f"{part}: expected a dict, got {type(state.get(part)).__name__}")
    inserts, inserted = state["rate_limiter"].get("inserts"), state["slots"].get("inserted")
    if R.is_int(inserts) and R.is_int(inserted) and inserts > inserted:
        # an item counts as inserted once written, after it took its ordinal
        raise SF.StateError(
            f"rate_limiter.inserts is {inserts}, but only {inserted} items were inserted "
            "(slots.inserted)"
        )
    if state["slots"].get("hi") != hi:
        raise SF.StateError(
            f"slots.hi is {state['slots'].get('hi')!r:.40}, metadata.json says {hi}"
        )
    if "episode_base" in state:
        SF.integer(state, "episode_base", "<state>")
    if "generator" in state:
        SF.tensor(state, "generator", "<state>", like=table.generator.get_state())


def _check_ranks(spec: TableSpec, state: dict[str, Any], rows: _Columns) -> None:
    """A max-value table ranks each live item by its key, as the extend that wrote it did
    (``writer.values``: the key as float64): a NaN there would outrank every value and
    never leave, another value would keep the wrong items. (``state`` was loaded: its
    tensors have the table's shapes.)"""
    if not isinstance(spec.writer, MaxValueWriterSpec):
        return
    hi = rows.hi
    key = rows[split_key(spec.writer.key)].to(torch.float64)
    values, live = state["writer"]["values"][:hi], state["slots"]["live"][:hi]
    wrong = (live & ~(values == key)).nonzero()
    if len(wrong):
        slot = int(wrong[0])
        raise SF.StateError(
            f"writer.values: slot {slot} is ranked by {float(values[slot])}, but its "
            f"{spec.writer.key!r} is {float(key[slot])} (the ranks are the rows' keys)"
        )


def _check_episodes(spec: TableSpec, state: dict[str, Any], rows: _Columns) -> None:
    """A slice table's episode ids are what its extends made of the rows: the
    ``traj_key`` itself, or (``end_key``) the id of the item before, plus one where that
    item ended an episode. Other ids would join steps of two episodes into one slice (or
    the next insert to an ended episode). (``state`` was loaded: shapes are the table's.)"""
    if not isinstance(spec.sampler, SliceSamplerSpec):
        return
    hi = rows.hi
    episode, slots = state["sampler"]["episode"][:hi], state["slots"]
    live, ordinal = slots["live"][:hi], slots["ordinal"][:hi]
    if spec.sampler.traj_key is not None:
        key = spec.sampler.traj_key
        wrong = (live & (episode != rows[split_key(key)].to(torch.int64))).nonzero()
        if len(wrong):
            slot = int(wrong[0])
            raise SF.StateError(
                f"sampler.episode: slot {slot} is in episode {int(episode[slot])}, but its "
                f"{key!r} is {rows[split_key(key)][slot].item()}"
            )
        return
    key = spec.sampler.end_key or ""
    ends = rows[split_key(key)].to(torch.int64)
    after = torch.arange(1, hi + 1) % hi  # the ring's next slot (a full ring wraps to 0)
    linked = live & live[after] & (ordinal[after] == ordinal + 1)
    wrong = (linked & (episode[after] != episode + ends)).nonzero()
    if len(wrong):
        slot = int(wrong[0])
        raise SF.StateError(
            f"sampler.episode: slot {int(after[slot])} is in episode {int(episode[after[slot]])}, "
            f"but the item before it (slot {slot}, {key!r} {int(ends[slot])}) is in episode "
            f"{int(episode[slot])}: expected {int(episode[slot] + ends[slot])}"
        )
    newest = ((ordinal == slots["inserted"]) & live).nonzero()
    base = state.get("episode_base", 0)
    if len(newest) and base != int(episode[newest[0]] + ends[newest[0]]):
        slot = int(newest[0])
        raise SF.StateError(
            f"episode_base is {base}, but the newest item (slot {slot}, episode "
            f"{int(episode[slot])}, {key!r} {int(ends[slot])}) makes it "
            f"{int(episode[slot] + ends[slot])}"
        )
