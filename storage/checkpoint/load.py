"""Reading a checkpoint folder, checked, in the steps a restore and an offline export share.

:func:`read_head` reads ``metadata.json`` (format, spec, ``hi``, layout flags),
:func:`read_state` the table's state, :func:`read_rows` its rows, mapped
copy-on-write (nothing is copied into memory but TorchRL's flat layout, which is
unflattened), and :func:`check_state_parts` what the state says of the table as a whole.
A restore (:mod:`.restore`) loads what these give into a table it allocates; an
export of a checkpoint (:mod:`.items`) reads the live rows out of them, oldest first,
and allocates nothing of the declared capacity. Within :func:`reading`, every
problem found is an :class:`~tdreplay.storage.InvalidCheckpoint` naming the
checkpoint, and a disk failure a :class:`~tdreplay.storage.CheckpointError`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tdreplay.codec.spaces import outside_categories

from .. import statefile as SF
from ..errors import CheckpointError, InvalidCheckpoint, TDReplayError
from ..spec import NestedKey, TableSpec, join_key
from ..tensordicts import leaves, nest
from . import reader as R
from .folder import METADATA, READABLE_FORMATS, V1_STATE, find, read_metadata

Rows = dict[NestedKey, torch.Tensor]


@dataclass(frozen=True)
class Head:
    """What a checkpoint's ``metadata.json`` says, checked.

    Attributes:
        src: the checkpoint folder read (the one at the path, or the copy an interrupted
            swap set aside: :func:`~.folder.find`).
        spec: the table's spec.
        version: the checkpoint format.
        hi: slots ever written at the checkpoint.
        ted2flat: its rows are in TorchRL's flat TED layout.
        live_only: its rows are those of the slots live then, in slot order.
    """

    src: Path
    spec: TableSpec
    version: int
    hi: int
    ted2flat: bool
    live_only: bool


def read_head(path: Path, expect: TableSpec | None) -> Head:
    """The metadata of the checkpoint at ``path``, checked (``expect``: the spec the caller
    read and checked before; another one now is refused).

    Raises:
        CheckpointError: no checkpoint at ``path``.
        InvalidCheckpoint: an unsupported format, a metadata field missing or wrong, or
            a spec other than ``expect``.
        SchemaError: the spec is invalid.
    """
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
    return Head(src, spec, version, hi, ted2flat, live_only)


@contextlib.contextmanager
def reading(head: Head, doing: str = "restore") -> Iterator[None]:
    """Errors raised within, reported as ``cannot <doing> <checkpoint>: ...``: an
    :class:`InvalidCheckpoint` (a disk failure: :class:`CheckpointError`); an error of
    tdreplay's own but those goes through as it is."""
    spec, src = head.spec, head.src
    try:
        yield
    except InvalidCheckpoint as err:
        raise InvalidCheckpoint(
            f"cannot {doing} {src}: {err}",
            table=spec.name,
            field=err.field,
            expected=err.expected,
            got=err.got,
        ) from None
    except TDReplayError:
        raise
    except Exception as err:
        raise invalid(src, err, spec.name, doing) from err


def invalid(src: Path, err: Exception, table: str, doing: str = "restore") -> CheckpointError:
    """``err`` raised while reading ``src``, as the error a restore (or ``doing``) reports."""
    if isinstance(err, OSError) and not isinstance(err, FileNotFoundError):
        # the disk failed, not the checkpoint
        return CheckpointError(f"cannot {doing} {src}: {err}", table=table)
    return InvalidCheckpoint(f"cannot {doing} {src}: {err}", table=table)


def read_state(head: Head) -> dict[str, Any]:
    """The table state of a checkpoint: JSON + raw tensors (format 2), or ``weights_only``
    (1), no larger than a table of its capacity keeps (checked before it is read)."""
    src, capacity = head.src, head.spec.capacity
    if head.version >= 2:
        if os.path.lexists(src / V1_STATE):
            # Never written beside a format 2 state: planted, or two checkpoints mixed up.
            raise InvalidCheckpoint(
                f"it holds {V1_STATE}, which a format {head.version} checkpoint never has "
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


def check_state_parts(state: dict[str, Any], hi: int) -> None:
    """Check the table-level parts of ``state`` against the metadata's ``hi`` (the
    components check their own).

    Raises:
        StateError: a part is missing or not a dict, more inserts counted than items
            inserted, ``slots.hi`` is not ``hi``, or ``episode_base`` is not an integer.
    """
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


def live_slots(state: dict[str, Any], hi: int, capacity: int) -> torch.Tensor | None:
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


def read_rows(head: Head, state: dict[str, Any]) -> tuple[Rows | None, torch.Tensor | None]:
    """The checkpoint's rows (``None``: none), each field mapped copy-on-write (TorchRL's
    flat layout: unflattened into memory), and the slots they are (``None``: ``[0, hi)``;
    ``live_only``: the slots live in ``state``), their categories checked."""
    src, spec, hi = head.src, head.spec, head.hi
    rows: Rows | None = None
    slots = None
    if hi and head.live_only:
        slots = live_slots(state, hi, spec.capacity)
        if slots is not None and len(slots):
            rows = R.read_rows(src, spec, len(slots))
    elif hi and head.ted2flat:
        schema = spec.torch_schema()
        empty = {k: torch.empty([hi, *shape], dtype=d) for k, (shape, d) in schema.items()}
        got = leaves(R.load_flat(src, spec, hi, nest(empty, hi)))
        rows = {k: torch.as_tensor(got[k]) for k in schema}
    elif hi:
        rows = R.read_rows(src, spec, hi)
    if rows is not None:
        _check_categories(spec, rows, slots)
    return rows, slots


def _check_categories(spec: TableSpec, rows: Rows, slots: torch.Tensor | None) -> None:
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
