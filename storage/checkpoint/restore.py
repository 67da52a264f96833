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

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .. import statefile as SF
from ..backends import allocate, primary_location, sweep
from ..errors import CheckpointError, TDReplayError
from ..redis_conn import Connections
from ..spec import (
    MaxValueWriterSpec,
    NestedKey,
    SliceSamplerSpec,
    TableSpec,
    split_key,
)
from .folder import overlaps, path_lock
from .load import check_state_parts, invalid, read_head, read_rows, read_state, reading

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
        raise invalid(src, err, spec.name) from err
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
    head = read_head(path, expect)
    src, spec = head.src, head.spec
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
    with reading(head):
        state = read_state(head)
        rows, slots = read_rows(head, state)
    return src, spec, root, head.hi, rows, slots, state


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


def _check_table_state(table: Restorable, state: dict[str, Any], hi: int) -> None:
    """Check the table-level parts of ``state`` (the components check their own)."""
    check_state_parts(state, hi)
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
