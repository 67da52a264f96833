"""Crash-durable memmap tables: a table's state lives in files beside its rows.

A memmap table's rows are memory-mapped files; once a write returns, the
bytes are in the kernel's page cache and survive a crash of the process
(``kill -9``, an OOM kill) - only a crash of the host can lose them before
the kernel writes them back. This module gives the table's *state* the same
property, so a restarted server reopens every acknowledged row without a
checkpoint:

* **Per-slot columns** (``live``, ordinal and times sampled per slot,
  priorities, episode ids, max-value keys) are memory-mapped files too:
  the table's parts keep using plain tensors, which are views of the files
  (``columns()`` / ``bind_columns()`` of :class:`~tdreplay.storage.slots.Slots`,
  the samplers and the writers). Updating them costs what it costs in RAM.
  A never-written slot's state is all zeros, so the files start as holes and
  are reserved on disk with the rows, an extent at a time
  (:mod:`~tdreplay.storage.extents`): disk follows the data.
* **Scalars** (write cursor, queue head, stack top, rate-limiter counters,
  episode counter, largest priority) are one small record written at the end
  of every state change, into one of two alternating slots of ``record.bin``,
  each with a generation number and a checksum: a record torn by a crash is
  detected and the other slot used. Which scalars, and their types, the parts
  declare themselves (:mod:`~tdreplay.storage.scalars`), for their
  ``state_dict()`` and the record alike; the record only fixes where each one
  lies (:mod:`~tdreplay.storage.record`).
* **Ordering**: an insert writes its rows, then the new items' per-slot state
  (:meth:`Sampler.before_live <tdreplay.storage.samplers.Sampler.before_live>`),
  then marks them live, then the record. Whatever instant a crash hits, a live
  slot holds a whole item and its own state; an insert cut short leaves its
  slots not live (never served). What the record may miss after such a crash
  (a count of the last insert) is derived again from the columns on open:
  live count, high-water mark, items inserted, the ring's cursor, the
  queue's head, the stack's top.
* **Generator, sumtree, slice validity, epoch permutation** are rebuilt on
  open (a without-replacement sampler starts a new epoch).

Layout, inside the table's storage folder (``<root>/tables/<name>/storage``)::

    .tdreplay-state/
      spec.json        the table's spec; written last: a folder without it is incomplete
      record.bin       two scalar records (generation, checksum)
      <column>.bin     one raw file per per-slot column

With ``fsync=True`` every extend and sample also flushes the row and state
files to disk before it returns (survives a power loss; costs a disk flush
per call).

Nothing here is read with pickle: raw little-endian arrays whose dtype and
shape come from the spec, and JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import weakref
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from .columnfiles import (
    ADDED_COLUMNS,
    RENAMED_COLUMNS,
    create_file,
    data_end,
    map_file,
    upgrade_column,
)
from .diskspace import fsync_path
from .errors import BackendError
from .extents import Extents, Span
from .rate_limiter import RateLimiter
from .record import RECORD_BYTES, RecordLayout
from .samplers import Sampler
from .scalars import Scalar
from .slot_policy import SlotPolicy
from .slots import Slots
from .spec import TableSpec
from .statefile import StateError


class _Backend(Protocol):
    @property
    def extents(self) -> Extents | None: ...


class Table(Protocol):
    """What durable state binds and restores of a table (a
    :class:`~tdreplay.storage.table.base.TableBase`): its parts, their state, its backend's
    extents (the state files are reserved with its rows)."""

    spec: TableSpec
    slots: Slots
    sampler: Sampler
    writer: SlotPolicy
    rate_limiter: RateLimiter
    episode_base: int

    @property
    def backend(self) -> _Backend: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


STATE_DIR = ".tdreplay-state"
SPEC_FILE = "spec.json"
RECORD_FILE = "record.bin"
#: the column holding the slots' ordinals (0: never written), which end the written slots
ORDINAL_COLUMN = "slots.sampled_ordinal"


class DurableState:
    """The files that keep a memmap table's state (see the module docstring).

    Build it with :meth:`create` (a new, empty table: columns initialised from
    the table's fresh parts) or :meth:`open` (a table reopened after its process
    ended: columns mapped, scalars read back and reconciled).
    """

    def __init__(self, folder: Path, table: Table) -> None:
        self.folder = folder
        # Weak: the table holds this, and a cycle through it would keep a deleted table's
        # files mapped (their disk taken) until Python's cycle collector happened to run.
        self.table: Table = weakref.proxy(table)
        self._table = weakref.ref(table)  # the table itself: a save reads it faster than a proxy
        self._record: np.ndarray | None = None
        self._layout = RecordLayout(table)
        self._gen = 0
        self.fsync = False
        self._files: list[Path] | None = None

    # ------------------------------------------------------------ columns
    @staticmethod
    def _columns(table: Table) -> dict[str, torch.Tensor]:
        return {**table.slots.columns(), **table.sampler.columns(), **table.writer.columns()}

    def _bind(self, mapped: dict[str, torch.Tensor]) -> None:
        t = self.table
        t.slots.bind_columns({k: v for k, v in mapped.items() if k.startswith("slots.")})
        t.sampler.bind_columns({k: v for k, v in mapped.items() if k.startswith("sampler.")})
        t.writer.bind_columns({k: v for k, v in mapped.items() if k.startswith("writer.")})

    def _map_record(self) -> None:
        path = self.folder / RECORD_FILE
        if path.stat().st_size != 2 * RECORD_BYTES:
            raise BackendError(
                f"{path} holds {path.stat().st_size} bytes, expected {2 * RECORD_BYTES}: "
                "damaged table state (or written by another version of tdreplay)"
            )
        # torch maps the file and closes it: a table costs no file descriptor
        mapped = torch.from_file(str(path), shared=True, size=2 * RECORD_BYTES, dtype=torch.uint8)
        self._mapped = mapped  # keeps the mapping alive
        self._record = mapped.numpy()
        self._record_bytes = self._record.data  # written a record at a time, uncopied

    def _reserve_with_rows(self, mapped: dict[str, torch.Tensor]) -> None:
        """The column files join the rows' extents: reserved as far as the rows are now,
        and with them from then on."""
        extents = self.table.backend.extents
        if extents is not None:
            extents.add(
                [
                    Span(self.folder / f"{name}.bin", 0, t[:1].numel() * t.element_size())
                    for name, t in mapped.items()
                ]
            )

    @classmethod
    def create(cls, folder: Path, table: Table) -> DurableState:
        """Lay out the state files of a new table and bind its parts to them.

        The files are holes: a fresh table's per-slot state is zeros (see
        :mod:`~tdreplay.storage.slots`), so nothing is copied into them.
        """
        state = cls(folder, table)
        folder.mkdir()
        mapped = {}
        n = table.slots.reach()  # past it a column is zeros: its file stays a hole there
        for name, tensor in cls._columns(table).items():
            path = folder / f"{name}.bin"
            create_file(path, tensor.numel() * tensor.element_size())
            mapped[name] = map_file(path, tensor.dtype, tuple(tensor.shape))
            if bool(tensor[:n].any()):  # not a fresh table's state after all: keep it
                mapped[name][:n].copy_(tensor[:n])
        create_file(folder / RECORD_FILE, 2 * RECORD_BYTES, reserve=True)  # zeros: no record
        state._map_record()
        state._reserve_with_rows(mapped)
        state._bind(mapped)
        state.save()
        return state

    def commit(self) -> None:
        """Mark the state complete (the table may be reopened from it): ``spec.json``, written
        last. A reopened table whose stored spec is this one's already writes nothing (a
        server restarted on a full disk serves its tables)."""
        spec = self.table.spec.model_dump(mode="json")
        path = self.folder / SPEC_FILE
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            if json.loads(path.read_text())["spec"] == spec:
                return
        body = json.dumps({"spec": spec, "created_at": time.time()})
        tmp = self.folder / f"{SPEC_FILE}.tmp"
        tmp.write_text(body)
        os.replace(tmp, path)

    @staticmethod
    def complete(location: Path) -> bool:
        """Whether ``location`` holds the complete state of a table (it can be reopened)."""
        return (location / STATE_DIR / SPEC_FILE).is_file()

    @staticmethod
    def newest(locations: list[Path]) -> tuple[Path, dict[str, Any]] | None:
        """Of ``locations``, the one holding the most recently committed complete state, and its spec.

        Several exist when a restore beside the table was under way at a crash;
        the older ones are dead data (the allocator's sweep deletes them).
        """
        best: tuple[float, Path, dict[str, Any]] | None = None
        for location in locations:
            if location.is_symlink() or not DurableState.complete(location):
                continue
            stored, created = DurableState.read_spec(location)
            if best is None or created > best[0]:
                best = (created, location, stored)
        return None if best is None else (best[1], best[2])

    @staticmethod
    def read_spec(location: Path) -> tuple[dict[str, Any], float]:
        """The spec (as JSON) and creation time of the table whose state is at ``location``."""
        data = json.loads((location / STATE_DIR / SPEC_FILE).read_text())
        if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
            raise BackendError(f"{location}: damaged table state ({SPEC_FILE})")
        return data["spec"], float(data.get("created_at", 0.0))

    @classmethod
    def open(cls, folder: Path, table: Table) -> DurableState:
        """Map the state files of ``folder`` into ``table`` and restore its scalars.

        Raises:
            BackendError: a file is missing or has the wrong size.
        """
        state = cls(folder, table)
        mapped = {}
        for name, tensor in cls._columns(table).items():
            path = folder / f"{name}.bin"
            if name in RENAMED_COLUMNS:  # state of an earlier version
                upgrade_column(folder, name, tensor)
            if name in ADDED_COLUMNS and not path.exists():  # state of an earlier version
                create_file(path, tensor.numel() * tensor.element_size())
            mapped[name] = map_file(path, tensor.dtype, tuple(tensor.shape))
        state._map_record()
        state._reserve_with_rows(mapped)
        try:
            state._load(mapped)
        except StateError as err:  # the columns disagree with each other: not served
            raise BackendError(f"{folder}: damaged table state: {err}") from None
        return state

    # ------------------------------------------------------------ scalars
    def save(self) -> None:
        """Write the scalar record (into the older of the two slots). Caller holds the table lock.

        A few microseconds: one ``struct.pack`` and a CRC of ~90 bytes into a
        shared mapping (no system call).
        """
        assert self._record is not None
        self._gen += 1
        record = self._layout.pack(self._gen, self._table())
        start = (self._gen % 2) * RECORD_BYTES
        self._record_bytes[start : start + len(record)] = record
        if self.fsync:
            self.flush()

    def _read_record(self) -> dict[tuple[str, str], Scalar] | None:
        """The newest whole record, by field; ``None`` when neither slot holds one."""
        assert self._record is not None
        best = None
        for slot in range(2):  # a slot never written, or torn by a crash, is None
            found = self._layout.unpack(self._record[slot * RECORD_BYTES :].tobytes())
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        if best is None:
            return None
        self._gen = best[0]
        return best[1]

    def _written(self, mapped: dict[str, torch.Tensor]) -> int:
        """``hi`` of the bound columns: slots ``[0, hi)`` have been written (the last one
        holds an ordinal; an insert writes it before the item is live). The one bound of a
        reopen's reads: the ordinal file is read over its data only (past it, a hole reads
        as zeros), and every column over ``[0, hi)`` only. Reading a hole backs its page on
        a tmpfs, and on a full one that read is a SIGBUS."""
        slot_bytes = mapped[ORDINAL_COLUMN][:1].nbytes
        n = -(-data_end(self.folder / f"{ORDINAL_COLUMN}.bin") // slot_bytes)
        written = (self.table.slots.ordinal[:n] > 0).nonzero()
        return int(written[-1]) + 1 if len(written) else 0

    def _load(self, mapped: dict[str, torch.Tensor]) -> None:
        """Bind the parts to the columns, restore the scalars from the record and re-derive
        from the columns what they pin down.

        The columns are read over the written slots only (:meth:`_written`), in place: the
        state the table loads (checked) views the files (:meth:`Slots.viewed
        <tdreplay.storage.slots.Slots.viewed>`), so they are neither copied into memory nor
        written: a restart dirties no page and backs no hole.
        """
        t = self.table
        self._bind(mapped)
        s = t.slots
        s.hi = self._written(mapped)
        with s.viewed():
            state = t.state_dict()  # the files' state over [0, hi): views, zeros past it
        rec = self._read_record() or dict.fromkeys(self._layout.fields, 0)
        for (part, name), value in rec.items():  # the record's scalars, as the parts declared them
            (state if part == "table" else state[part])[name] = value
        recorded_inserted = int(state["slots"]["inserted"])
        hi = s.hi
        live, ordinal = state["slots"]["live"][:hi], state["slots"]["ordinal"][:hi]
        n_live = int(live.sum())
        inserted = max(recorded_inserted, int(ordinal.max()) if hi else 0)
        # The ring's cursor is the slot after the newest item; the queue's head
        # its oldest live item; the stack's top the end of its live run.
        cursor = (int(ordinal.argmax()) + 1) % s.capacity if hi else 0
        live_idx = live.nonzero().squeeze(1)
        if len(live_idx):
            head = int(live_idx[ordinal[live_idx].argmin()])
            top = int(live_idx.max()) + 1
        else:
            head, top = cursor, 0
        state["slots"].update(n_live=n_live, hi=hi, inserted=inserted)
        if "cursor" in state["writer"]:
            state["writer"]["cursor"] = cursor
        if "top" in state["writer"]:
            state["writer"]["top"] = top
        if "head" in state["sampler"]:
            state["sampler"]["head"] = head
        if "max_priority" in state["sampler"]:
            state["sampler"]["max_priority"] = max(float(state["sampler"]["max_priority"]), 1e-12)
        state["rate_limiter"]["inserts"] += max(0, inserted - recorded_inserted)  # inserts missed
        state.pop("generator", None)  # a reopened table draws from a fresh seed
        s.hi = 0  # loaded from nothing: the load reaches [0, hi) only, never past it
        t.load_state_dict(state)

    # ------------------------------------------------------------ disk
    def flush(self) -> None:
        """fsync the state files (their dirty pages go to disk)."""
        if self._files is None:  # the same files for the table's life: listed once
            self._files = sorted(p for p in self.folder.iterdir() if p.suffix == ".bin")
        for path in self._files:
            with contextlib.suppress(FileNotFoundError):
                fsync_path(path)


def spec_matches(stored: dict[str, Any], spec: TableSpec) -> bool:
    """Whether a stored spec (JSON) describes the same table as ``spec``: equal once both
    are validated (defaults added since it was stored filled in), how the disk is reserved
    (``backend.preallocate``) aside."""
    try:
        then = TableSpec.model_validate(stored)
    except ValueError:
        return False
    return then.difference(spec) is None
