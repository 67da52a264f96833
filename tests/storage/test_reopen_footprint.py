"""A reopened memmap table reads its per-slot state in place: the files are neither copied into
memory nor written.

Measured in a fresh process, from a point on (:data:`testkit.PEAK`): how far its resident memory
peaked during ``Table.open`` above what it holds once the table is open (its state files' pages
and its sampler's own structures), each tensor in a mapping of its own (a fixed
``MALLOC_MMAP_THRESHOLD_``), so the peak counts every tensor held at once, whatever glibc would
have reused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from testkit import PEAK

from tdreplay.storage import Table, TableSpec
from tdreplay.storage.durable import RECORD_FILE, STATE_DIR

CAPACITY = 1 << 20  # one int64 a slot: 8 MiB of rows, 25 MiB of state files (more prioritized)
MiB = 1 << 20


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


def reopen_in_a_fresh_process(sampler: str, root: Path, warm: Path) -> dict[str, int]:
    """Reopen the table of ``sampler`` under ``root`` in a fresh process (a small table
    opened under ``warm`` first: the code's first use does not count): its peak growth,
    what it held after and what it wrote into its state files' pages (their mappings' dirty
    pages), in bytes, and the table's size."""
    script = textwrap.dedent(
        f"""
        import json
        from tdreplay.storage import Table, TableSpec
        spec = TableSpec.model_validate_json({spec(sampler).model_dump_json()!r})
        Table.open(spec.model_copy(update={{"capacity": 64}}), {str(warm)!r}).destroy()
        before = reset_peak()
        table = Table.open(spec, {str(root)!r})
        peak, held = peak_growth(before), _status("VmRSS:") - before
        dirty, columns = 0, False  # bytes the open wrote into the column files' mappings
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split()
                if not head[0].endswith(":"):  # a mapping: columns of the table's state?
                    path = head[5] if len(head) > 5 else ""
                    columns = "/{STATE_DIR}/" in path and not path.endswith("/{RECORD_FILE}")
                elif columns and head[0] in ("Shared_Dirty:", "Private_Dirty:"):
                    dirty += int(head[1]) * 1024
        print(json.dumps({{"peak": peak, "held": held, "dirty": dirty, "size": table.size}}))
        table.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", PEAK + script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("sampler, bound", [("uniform", 48 * MiB), ("prioritized", 72 * MiB)])
def test_a_reopen_reads_its_state_in_place(tmp_path: Path, sampler: str, bound: int) -> None:
    """The state was read from the files into copies, which the table loaded into its own
    tensors before binding the files instead: twice the state in memory for a moment (a
    million slots, uniform: 67 MiB above what the open table holds; prioritized: 98 MiB).
    Now the state loaded (checked) views the files: 33 and 48 MiB, the derivations the
    load makes from it (live slots, cursor, the sum tree)."""
    root = tmp_path / "data"
    table = Table.create(spec(sampler), root)
    for start in range(0, CAPACITY, CAPACITY // 4):
        table.extend(TensorDict({"x": torch.arange(start, start + CAPACITY // 4)}, [CAPACITY // 4]))
    table.close()
    for path in root.rglob("*.bin"):  # on disk: a page still dirty is this process' write
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    got = reopen_in_a_fresh_process(sampler, root, tmp_path / "warm")

    assert got["size"] == CAPACITY
    transient = got["peak"] - got["held"]
    assert transient < bound, f"reopening peaked {transient / MiB:.1f} MiB above what it holds"
    assert got["dirty"] == 0, "the reopen wrote into its state files"
    again = Table.open(spec(sampler), root)
    try:
        batch = again.sample(256)
        assert torch.equal(batch["sample_info", "key"], batch["x"] + 1)
    finally:
        again.destroy()
