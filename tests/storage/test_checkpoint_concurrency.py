"""Checkpoints written while the table runs: one consistent snapshot, and nobody waits on it.

Every row of these tables is a function of its insert number (``id``, which
the single writer makes one less than the row's ordinal), so a restored checkpoint
can be checked against the one state it claims to be: every live row holds
the item its ordinal names, whole (no torn rows), and counts, ``hi`` and the
writer's cursor agree with the live slots.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from testkit import assert_consistent, make_spec, rows

from tdreplay.storage import CheckpointError, Table, TableSpec
from tdreplay.storage.table import snapshot as C

CAPACITY = 256
PAD = 64  # int32 per row, so a chunk of a few rows is a real copy
MAX_EXTEND = 24


def spec(backend: dict, **extra) -> TableSpec:
    return make_spec(
        capacity=CAPACITY,
        backend=backend,
        fields={"pad": {"shape": [PAD], "dtype": "int32"}},
        rate_limiter={"min_size_to_sample": 1},
        **extra,
    )


def items(start: int, n: int) -> TensorDict:
    """Items ``start .. start+n-1``: every field, ``pad`` included, encodes the item id."""
    td = rows(start, n)
    td["pad"] = td["id"].to(torch.int32)[:, None].expand(n, PAD).clone()
    return td


def assert_items(batch: TensorDict) -> None:
    assert_consistent(batch)
    assert torch.equal(batch["pad"], batch["id"].to(torch.int32)[:, None].expand(-1, PAD))


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copy a few rows per chunk, so writers get between the chunks of every checkpoint."""
    monkeypatch.setattr(C, "CHUNK_BYTES", 4 * spec({"kind": "memory"}).item_nbytes)


def check_snapshot(table: Table) -> None:
    """``table`` (restored) is a state a single-writer round-robin table passes through."""
    s = table.slots
    live = s.live.nonzero().squeeze(1)
    assert int(s.live.sum()) == s.n_live == len(table)
    assert not s.live[s.hi :].any(), "a live slot at or past hi"
    assert table.writer.state_dict()["cursor"] == s.inserted % CAPACITY
    seq = s.ordinal[live] - 1  # insert numbers
    # item i goes to slot i % capacity; the live items are the newest, bar one
    # insert in flight at the snapshot (claimed, not yet live)
    assert torch.equal(seq % CAPACITY, live)
    if len(seq):
        newest = int(seq.max()) + 1
        assert sorted(seq.tolist()) == list(range(newest - len(seq), newest))
        assert 0 <= s.inserted - newest <= MAX_EXTEND
        assert s.hi == min(CAPACITY, newest)
        assert len(seq) >= min(s.hi, CAPACITY) - MAX_EXTEND
    data = table.read(live)
    assert torch.equal(data["id"], seq), "a live row holds another item than its ordinal names"
    assert_items(data)


def run_concurrently(table: Table, tmp_path: Path, tables, *, checkpoints: int, **kw) -> int:
    """One writer and two samplers run while ``checkpoints`` checkpoints are written and checked."""
    stop = threading.Event()
    errors: list[BaseException] = []
    written = [0]

    def guard(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                while not stop.is_set():
                    fn()
            except BaseException as err:  # reported by the main thread
                errors.append(err)
                stop.set()

        return run

    gen = torch.Generator().manual_seed(0)

    def write() -> None:
        n = int(torch.randint(1, MAX_EXTEND + 1, (1,), generator=gen))
        table.extend(items(written[0], n))
        written[0] += n

    def sample() -> None:
        batch = table.sample(16)
        assert_items(batch)
        assert torch.equal(batch["sample_info", "key"], batch["id"] + 1)  # ordinals

    table.extend(items(0, CAPACITY // 2))
    written[0] = CAPACITY // 2
    threads = [threading.Thread(target=guard(f)) for f in (write, sample, sample)]
    for t in threads:
        t.start()
    overwritten = []
    try:
        for i in range(checkpoints):
            if stop.is_set():
                break
            before = written[0]
            path = table.checkpoint(tmp_path / "ckpt", **kw)
            overwritten.append(written[0] - before)
            restored = tables.restore(path, root=tmp_path / f"restored-{i}")
            try:
                check_snapshot(restored)
            finally:
                restored.destroy()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    if errors:
        raise errors[0]
    assert table._before_write == []
    return sum(overwritten)


@pytest.mark.usefixtures("small_chunks")
def test_checkpoints_under_load_are_consistent_snapshots(
    backend: dict, tables, tmp_path: Path
) -> None:
    table = tables.create(spec(backend))
    n = 4 if backend["kind"] == "redis" else 12
    moved = run_concurrently(table, tmp_path, tables, checkpoints=n)
    assert moved > 0, "no insert ran during the checkpoints: the test proved nothing"


@pytest.mark.usefixtures("small_chunks")
def test_ted2flat_checkpoints_under_load_are_consistent_snapshots(tables, tmp_path: Path) -> None:
    table = tables.create(spec({"kind": "memmap"}))
    moved = run_concurrently(table, tmp_path, tables, checkpoints=8, ted2flat=True)
    assert moved > 0


# ---------------------------------------------------------------- deterministic interleavings
@contextmanager
def between_chunks(table: Table, at: int, action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` before the data read lock is taken with ``lock.read()`` the ``at``-th time.

    Only a checkpoint takes it so (samples call ``acquire_read``): the first
    time is its state capture, the second its first chunk's copy, and so on.
    ``action`` runs in the checkpoint's copying thread, between two chunks.
    """
    lock = table._data_lock
    real = lock.read
    calls = [0]

    @contextmanager
    def read() -> Iterator[None]:
        calls[0] += 1
        if calls[0] == at:
            action()
        with real():
            yield

    lock.read = read  # type: ignore[method-assign]
    try:
        yield
    finally:
        lock.read = real  # type: ignore[method-assign]
    assert calls[0] >= at, "the checkpoint had fewer chunks than the test meant to interleave"


def half_overwritten(tables, tmp_path: Path) -> tuple[Table, dict, TensorDict, Path]:
    """A full table, checkpointed while an insert overwrites rows the copy has not reached.

    Returns the table, its state and rows at the checkpoint's start, and the checkpoint.
    """
    table = tables.create(spec({"kind": "memory"}))
    table.extend(items(0, CAPACITY))
    table.extend(items(CAPACITY, CAPACITY // 2))  # full ring, cursor at CAPACITY // 2
    state = table.state_dict()
    before = table.read(torch.arange(CAPACITY))
    with between_chunks(
        table, 3, lambda: table.extend(items(CAPACITY + CAPACITY // 2, CAPACITY // 4))
    ):
        path = table.checkpoint(tmp_path / "ckpt")
    assert (
        int(table.slots.ordinal[CAPACITY // 2]) == CAPACITY + CAPACITY // 2 + 1
    )  # it did overwrite
    return table, state, before, path


@pytest.mark.usefixtures("small_chunks")
def test_rows_overwritten_during_a_checkpoint_are_saved_as_they_were(
    tables, tmp_path: Path
) -> None:
    table, state, before, path = half_overwritten(tables, tmp_path)
    restored = tables.restore(path, root=tmp_path / "r")
    assert torch.equal(restored.read(torch.arange(CAPACITY))["id"], before["id"])
    assert (restored.read(torch.arange(CAPACITY)) == before).all()
    assert restored.slots.inserted == state["slots"]["inserted"]
    assert torch.equal(restored.slots.ordinal, state["slots"]["ordinal"])
    assert restored.writer.state_dict() == state["writer"]
    check_snapshot(restored)
    assert table._before_write == []


@pytest.mark.usefixtures("small_chunks")
def test_the_check_catches_a_snapshot_without_copy_on_write(
    tables, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Self-test of the checks above: without the hook the snapshot is torn, and they say so."""
    monkeypatch.setattr(C.Snapshot, "before_write", lambda self, rows: None)
    _, _, before, path = half_overwritten(tables, tmp_path)
    restored = tables.restore(path, root=tmp_path / "r")
    assert not torch.equal(restored.read(torch.arange(CAPACITY))["id"], before["id"])
    with pytest.raises(AssertionError, match="another item than its ordinal"):
        check_snapshot(restored)


@pytest.mark.usefixtures("small_chunks")
def test_extend_and_sample_go_on_while_a_checkpoint_is_written(tables, tmp_path: Path) -> None:
    table = tables.create(spec({"kind": "memmap"}))
    table.extend(items(0, CAPACITY))
    paused, resume = threading.Event(), threading.Event()

    def pause() -> None:
        paused.set()
        assert resume.wait(30)

    result: list[object] = []

    def write() -> None:
        with between_chunks(table, 2, pause):
            try:
                result.append(table.checkpoint(tmp_path / "ckpt"))
            except BaseException as err:
                result.append(err)

    t = threading.Thread(target=write)
    t.start()
    try:
        assert paused.wait(30)
        # the checkpoint is half written: the table neither waits nor blocks
        assert_items(table.sample(32, timeout=5))
        table.extend(items(CAPACITY, 16), timeout=5)
        assert table.can_insert() and table.can_sample()
    finally:
        resume.set()
        t.join(30)
    assert result and isinstance(result[0], Path), result
    restored = tables.restore(tmp_path / "ckpt", root=tmp_path / "r")
    assert restored.slots.inserted == CAPACITY  # the snapshot predates the extend
    check_snapshot(restored)


@pytest.mark.usefixtures("small_chunks")
def test_a_failed_save_fails_the_checkpoint_not_the_insert(
    tables, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tables.create(spec({"kind": "memory"}))
    table.extend(items(0, CAPACITY))

    def broken(index: torch.Tensor) -> dict:
        raise OSError("disk on fire")

    def insert() -> None:
        monkeypatch.setattr(table.backend, "read", broken)
        table.extend(items(CAPACITY, 8))  # goes through

    with (
        between_chunks(table, 2, insert),
        pytest.raises(CheckpointError, match="could not be saved: disk on fire"),
    ):
        table.checkpoint(tmp_path / "ckpt")
    assert table._before_write == []
    assert not (tmp_path / "ckpt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt")] == []
    assert int(table.slots.ordinal[0]) == CAPACITY + 1


@pytest.mark.usefixtures("small_chunks")
def test_closing_the_table_fails_a_running_checkpoint(tables, tmp_path: Path) -> None:
    table = tables.create(spec({"kind": "memory"}))
    table.extend(items(0, CAPACITY))
    with (
        between_chunks(table, 2, table.close),
        pytest.raises(CheckpointError, match="closed while its snapshot was read"),
    ):
        table.checkpoint(tmp_path / "ckpt")
    assert table._before_write == []
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("filled", [CAPACITY // 2, CAPACITY - 4])
def test_ted2flat_with_an_insert_in_flight(tables, tmp_path: Path, filled: int) -> None:
    """Claimed, not yet written rows are not in the checkpoint, though the cursor is past them."""
    table = tables.create(spec({"kind": "memory"}))
    table.extend(items(0, filled))
    with table._cond:  # what extend does before it takes the data write lock
        claim = table.writer.claim(8)
        table.slots.busy[claim.target] = True
        table.slots.inserted += 8
    path = table.checkpoint(tmp_path / "ckpt", ted2flat=True)
    restored = tables.restore(path, root=tmp_path / "r")
    assert restored.slots.hi == filled and len(restored) == filled
    assert restored.writer.state_dict()["cursor"] == (filled + 8) % CAPACITY
    check_snapshot(restored)


def test_a_restore_never_mixes_two_checkpoints_written_meanwhile(tables, tmp_path: Path) -> None:
    """A restore of a path checkpointed to meanwhile (a periodic checkpoint, another
    client's) could read the metadata and rows of one checkpoint and the state of the
    next: of ~2,900 restores beside a checkpointing loop, 16 gave tables whose live rows
    held other items than their ordinals name. The two are serialized now."""
    table = tables.create(spec({"kind": "memory"}))
    table.extend(items(0, CAPACITY))  # full: every checkpoint has the same hi
    path = table.checkpoint(tmp_path / "ckpt")
    stop = threading.Event()
    errors: list[BaseException] = []

    def checkpoints() -> None:
        n = CAPACITY
        try:
            while not stop.is_set():
                table.extend(items(n, 7))
                n += 7
                table.checkpoint(path)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    writer = threading.Thread(target=checkpoints)
    writer.start()
    deadline = time.monotonic() + 4
    try:
        while time.monotonic() < deadline and not errors:
            restored = Table.restore(path, root=tmp_path / "r")
            try:
                check_snapshot(restored)
            finally:
                restored.destroy()
    finally:
        stop.set()
        writer.join(30)
    assert not errors
