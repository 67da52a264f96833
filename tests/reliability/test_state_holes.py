"""A memmap table's per-slot state files are holes past the slots written: nothing reads
or writes there. On a tmpfs, reading a hole's page through the mapping backs it (one
more page taken), and on a full one that read is a SIGBUS, which ends the server.

The disk is a small tmpfs mounted by the test (``mount -t tmpfs``, root only: skipped
otherwise). The tables hold one int64 a slot among a million: too large for the tmpfs to
reserve an extent ahead, so rows and state are reserved as far as the slots written.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from testkit import small_tmpfs

from tdreplay.storage import Table, TableSpec
from tdreplay.storage import statefile as SF
from tdreplay.storage.durable import STATE_DIR

CAPACITY = 1_000_000
PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk", 8) as mnt:
        yield mnt


def spec(sampler: str) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": "t",
            "capacity": CAPACITY,
            "fields": {"x": {"shape": [], "dtype": "int64"}},
            "backend": {"kind": "memmap"},
            "sampler": {"kind": sampler},
        }
    )


def items(start: int, n: int) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n)}, [n])


def live_file(root: Path) -> Path:
    return root / "tables" / "t" / "storage" / STATE_DIR / "slots.live.bin"


def test_restoring_a_stack_reads_no_slot_past_the_written_ones(
    small_disk: Path, tmp_path: Path
) -> None:
    """The stack's load checked that no slot at or above ``top`` is live by reading the
    live column from there to the end: the restored table's live file took its whole
    size (1 MB, every page read) for 10 items, and on a full tmpfs that read is a SIGBUS."""
    table = Table.create(spec("lifo"), small_disk / "a")
    try:
        table.extend(items(0, 10))
        table.checkpoint(tmp_path / "ck")
    finally:
        table.destroy()
    restored = Table.restore(tmp_path / "ck", small_disk / "b")
    try:
        assert restored.size == 10
        assert live_file(small_disk / "b").stat().st_blocks * 512 <= 2 * PAGE
        assert restored.sample(3)["x"].tolist() == [9, 8, 7]
    finally:
        restored.destroy()


ON_A_FULL_DISK = """
import errno, os, sys
import torch
from tensordict import TensorDict
from tdreplay.storage import Table, TableSpec
from tdreplay.storage.errors import InsufficientStorage

mnt, sampler = sys.argv[1], sys.argv[2]
spec = TableSpec.model_validate({
    "name": "t", "capacity": 1_000_000, "fields": {"x": {"shape": [], "dtype": "int64"}},
    "backend": {"kind": "memmap"}, "sampler": {"kind": sampler},
})
table = Table.create(spec, os.path.join(mnt, "data"))
table.extend(TensorDict({"x": torch.arange(10)}, [10]))

def fill():  # the tmpfs filled to the brim
    fd = os.open(os.path.join(mnt, "filler"), os.O_CREAT | os.O_WRONLY)
    for chunk in (1 << 16, 1 << 12):
        try:
            while True:
                os.write(fd, bytes(chunk))
        except OSError as err:
            assert err.errno == errno.ENOSPC, err
    os.close(fd)
"""


def on_a_full_disk(mnt: Path, sampler: str, then: str) -> str:
    """What a process prints that makes a table of ``sampler`` holding 10 items on the
    tmpfs ``mnt``, and runs ``then`` (``fill()`` fills the tmpfs); it must exit 0 (a SIGBUS
    is -7)."""
    done = subprocess.run(
        [sys.executable, "-c", ON_A_FULL_DISK + textwrap.dedent(then), str(mnt), sampler],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    return done.stdout


def test_a_queue_insert_on_a_full_tmpfs_is_a_507_not_a_sigbus(small_disk: Path) -> None:
    """A queue's writer asked whether the slots an insert would take hold unread items
    before the table reserved them: it read the live column there, past the slots
    written, and on a full tmpfs that read killed the process (SIGBUS)."""
    said = on_a_full_disk(
        small_disk,
        "fifo",
        """
        fill()
        try:
            table.extend(TensorDict({"x": torch.arange(5000)}, [5000]), timeout=0)
        except InsufficientStorage as err:
            print("507", err)
        print("size", table.size)
        """,
    )
    assert "507" in said and "size 10" in said, said


def test_a_stack_whose_top_is_past_its_written_slots_is_refused(small_disk: Path) -> None:
    """A loaded ``top`` past ``hi`` would have the LIFO sampler read the never-written
    slots below it (holes): refused, and nothing changes."""
    table = Table.create(spec("lifo"), small_disk / "a")
    try:
        table.extend(items(0, 10))
        state = table.state_dict()
        bad = {**state, "writer": {**state["writer"], "top": 4096 * 3}}
        with pytest.raises(SF.StateError, match=r"writer.top is 12288, past slots.hi \(10\)"):
            table.load_state_dict(bad)
        assert table.sample(2)["x"].tolist() == [9, 8]
        assert live_file(small_disk / "a").stat().st_blocks * 512 <= 2 * PAGE
    finally:
        table.destroy()


def test_the_slice_sampler_reads_no_slot_past_the_written_ones(
    small_disk: Path, tmp_path: Path
) -> None:
    """The slice sampler checked the windows around new items whole: the first items'
    windows wrap round the ring, so it read the last slots' pages of the live, ordinal and
    episode files (backed then, each a page more; on a full tmpfs a SIGBUS), and a
    restore read the whole ordinal column (1.6 MB here) to find the written slots."""
    table_spec = TableSpec.model_validate(
        {
            "name": "t",
            "capacity": 100_000,  # 56 MB of rows: no extent ahead fits the 8 MB tmpfs
            "fields": {
                "x": {"shape": [64], "dtype": "int64"},
                "traj": {"shape": [], "dtype": "int64"},
            },
            "backend": {"kind": "memmap"},
            "sampler": {"kind": "slice", "slice_len": 4, "traj_key": "traj", "end_key": None},
        }
    )
    batch = TensorDict(
        {"x": torch.arange(10)[:, None].expand(10, 64), "traj": torch.zeros(10, dtype=torch.int64)},
        [10],
    )

    def held(root: Path) -> dict[str, int]:
        folder = root / "tables" / "t" / "storage" / STATE_DIR
        return {
            p.name: p.stat().st_blocks * 512
            for p in folder.iterdir()
            if p.name.startswith(("slots.", "sampler."))
        }

    table = Table.create(table_spec, small_disk / "a")
    try:
        table.extend(batch)
        assert set(held(small_disk / "a")) == {
            "slots.live.bin", "slots.sampled_ordinal.bin", "slots.tag.bin", "sampler.episode.bin"
        }  # fmt: skip
        assert max(held(small_disk / "a").values()) <= PAGE, held(small_disk / "a")
        table.checkpoint(tmp_path / "ck")
    finally:
        table.destroy()
    restored = Table.restore(tmp_path / "ck", small_disk / "b")
    try:
        assert max(held(small_disk / "b").values()) <= PAGE, held(small_disk / "b")
        x = restored.sample(8)["x"][:, 0].reshape(2, 4)
        assert bool((x[:, 1:] - x[:, :-1] == 1).all()) and int(x.max()) <= 9
    finally:
        restored.destroy()


def test_stats_and_a_client_s_slots_read_no_slot_past_the_written_ones(small_disk: Path) -> None:
    """The stats scan copied the live column whole, and ``update_priority`` / ``remove``
    read live (and ordinal) at the client's slots, unwritten ones too: each backed pages
    of the state files past the rows (on a full tmpfs, a SIGBUS a client could cause)."""
    table = Table.create(spec("prioritized"), small_disk / "a")
    try:
        table.extend(items(0, 10))
        folder = small_disk / "a" / "tables" / "t" / "storage" / STATE_DIR

        def held() -> dict[str, int]:
            return {p.name: p.stat().st_blocks for p in folder.glob("s*.bin")}

        before = held()
        assert "slots.live.bin" in before and "sampler.priorities.bin" in before
        far = torch.tensor([CAPACITY - 1, CAPACITY // 2])
        assert table.update_priority(far, torch.ones(2), key=torch.tensor([3, 4])) == 0
        table.remove(far, key=torch.tensor([3, 4]))
        assert table.stats()["size"] == 10
        assert held() == before
    finally:
        table.destroy()


def held_state(root: Path) -> dict[str, int]:
    """Bytes each per-slot state file of table ``t`` under ``root`` takes."""
    folder = root / "tables" / "t" / "storage" / STATE_DIR
    return {p.name: p.stat().st_blocks * 512 for p in folder.glob("[sw]*.bin")}


@pytest.mark.parametrize("sampler", ["uniform", "fifo", "lifo", "prioritized", "max_value"])
def test_reopening_reads_no_slot_past_the_written_ones(small_disk: Path, sampler: str) -> None:
    """A reopen derived ``hi``, the live count, the ring's cursor, the queue's head and the
    stack's top from the ordinal and live columns read whole, and checked every column
    whole: a restart of a table holding 10 items backed its whole state files (3.3 MB
    here for 100,000 slots; a million slots' 25 MB filled the tmpfs: a SIGBUS)."""
    wide = {
        "name": "t",
        "capacity": 100_000,  # 51 MB of rows: no extent ahead fits the 8 MB tmpfs
        "fields": {"x": {"shape": [64], "dtype": "int64"}},
        "backend": {"kind": "memmap"},
        "sampler": {"kind": "uniform" if sampler == "max_value" else sampler},
    }
    if sampler == "max_value":
        wide["writer"] = {"kind": "max_value", "key": "v"}
        wide["fields"]["v"] = {"shape": [], "dtype": "float32"}  # type: ignore[index]
    table_spec = TableSpec.model_validate(wide)

    def batch(start: int, n: int) -> TensorDict:
        x = torch.arange(start, start + n)
        v = {"v": x + 1.0} if sampler == "max_value" else {}
        return TensorDict({"x": x[:, None].expand(n, 64), **v}, [n])

    table = Table.create(table_spec, small_disk / "a")
    table.extend(batch(0, 10))
    before = held_state(small_disk / "a")
    assert 0 < max(before.values()) <= PAGE, before
    table.close()
    reopened = Table.open(table_spec, small_disk / "a")
    try:
        assert reopened.size == 10
        assert held_state(small_disk / "a") == before
        x = reopened.sample(3)["x"][:, 0].tolist()
        assert x == {"fifo": [0, 1, 2], "lifo": [9, 8, 7]}.get(sampler, x)
        reopened.extend(batch(10, 2))
        assert reopened.size == 12 - (sampler in ("fifo", "lifo")) * 3
    finally:
        reopened.destroy()


def test_a_restart_on_a_full_tmpfs_serves_its_items_not_a_sigbus(small_disk: Path) -> None:
    """A table reopened on a full tmpfs read its state files past the written slots (holes
    there): the tmpfs had no page to back them with, and the restart died of SIGBUS."""
    said = on_a_full_disk(
        small_disk,
        "prioritized",
        """
        table.close()
        fill()
        table = Table.open(spec, os.path.join(mnt, "data"))
        x = table.sample(20)["x"]
        print("size", table.size, "drawn", 0 <= int(x.min()) and int(x.max()) <= 9)
        """,
    )
    assert "size 10 drawn True" in said, said


def test_a_sample_past_the_live_count_under_max_times_sampled_reads_no_unwritten_slot(
    small_disk: Path,
) -> None:
    """A sample of more items than are live, with ``max_times_sampled``, asked whether
    enough samples are left by reading the live column whole (the table's capacity): the
    live file took every page (on a full tmpfs, a SIGBUS any client's sample could cause)."""
    table_spec = TableSpec.model_validate({**spec("uniform").model_dump(), "max_times_sampled": 3})
    table = Table.create(table_spec, small_disk / "a")
    try:
        table.extend(items(0, 10))
        before = live_file(small_disk / "a").stat().st_blocks
        assert len(table.sample(12)["x"]) == 12
        assert live_file(small_disk / "a").stat().st_blocks == before
    finally:
        table.destroy()


def test_an_export_out_of_slot_order_reads_no_unwritten_slot(
    small_disk: Path, tmp_path: Path
) -> None:
    """A table whose items are not in ring order (a stack) is exported in ordinal order:
    that order was found by reading the live and ordinal columns whole (1 MB and 16 MB
    here, every page backed: on a full tmpfs, a SIGBUS)."""
    table = Table.create(spec("lifo"), small_disk / "a")
    try:
        table.extend(items(0, 10))
        folder = small_disk / "a" / "tables" / "t" / "storage" / STATE_DIR
        before = {p.name: p.stat().st_blocks for p in folder.glob("slots.*.bin")}
        out = table.export(tmp_path / "x.csv")
        assert out.rows == 10
        assert {p.name: p.stat().st_blocks for p in folder.glob("slots.*.bin")} == before
    finally:
        table.destroy()
