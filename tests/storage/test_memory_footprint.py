"""A memory table's rows take RAM as they are written, not its whole capacity at create.

Measured in a fresh process, as its own anonymous memory (``RssAnon`` in ``/proc/self/status``)
or its peak: a test worker's other threads would allocate meanwhile.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from testkit import PEAK

MiB = 1 << 20
ITEM = 64 << 10  # 64 KiB items
CAPACITY = 4096  # 256 MiB in all


#: a fresh process (no thread of an earlier test allocating meanwhile) measuring its own
#: anonymous memory (RssAnon) around a memory table's create and an extend of a quarter of it
MEMORY_TABLE = """
import gc, json, sys, torch
from tensordict import TensorDict
from tdreplay.storage import Table, TableSpec
capacity, item = int(sys.argv[2]), int(sys.argv[3])
def anon():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))
spec = TableSpec.model_validate({"name": "m", "capacity": capacity, "backend": {"kind": "memory"},
    "fields": {"x": {"shape": [], "dtype": "int64"}, "pad": {"shape": [item - 8], "dtype": "uint8"}}})
gc.collect()
before = anon()
table = Table.create(spec, sys.argv[1])
empty = anon() - before
n = capacity // 4
rows = TensorDict({"x": torch.arange(n), "pad": torch.ones(n, item - 8, dtype=torch.uint8)}, [n])
table.extend(rows)
del rows
gc.collect()
grown = anon() - before
batch = table.sample(64)
print(json.dumps({"empty": empty, "grown": grown, "n": n,
    "ones": bool((batch["pad"] == 1).all()) and int(batch["x"].max()) < n,
    "zeros": int(table.read(torch.tensor([capacity - 1]))["pad"].sum()) == 0}))
table.destroy()
"""


def test_a_memory_table_takes_ram_as_rows_come(tmp_path: Path) -> None:
    """``from_schema``'s ``torch.zeros`` wrote the whole capacity at create: an empty
    256 MiB table held 256 MiB of RAM (and a server admitted tables up to
    ``--max-table-bytes`` whatever the host's RAM)."""
    run = [sys.executable, "-c", MEMORY_TABLE, str(tmp_path), str(CAPACITY), str(ITEM)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["empty"] < 32 * MiB, "an empty table holds next to no RAM"
    # the rows written, no more (less a little the process freed meanwhile: 40 KiB seen)
    grown, n = got["grown"], got["n"]
    assert n * ITEM - MiB <= grown < n * ITEM + 48 * MiB, grown / MiB
    assert got["ones"], "a sample reads the rows written"
    assert got["zeros"], "a slot never written reads zeros"


SHARED_PEAK = (
    PEAK
    + """
import json
from tdreplay.storage import Table, TableSpec
spec = TableSpec.model_validate({"name": "s", "capacity": 4096, "backend": {"kind": "shared"},
    "fields": {"x": {"shape": [65536], "dtype": "uint8"}}})  # 256 MiB
before = reset_peak()
table = Table.create(spec, ROOT)
grew = peak_growth(before)
x = table.backend.tensors[("x",)]
print(json.dumps({"grew": grew, "shared": x.is_shared(), "zero": not bool(x.any())}))
table.destroy()
"""
)


def test_a_shared_table_is_not_built_twice_at_create(tmp_path: Path) -> None:
    """``from_schema(storage="shared")`` fills a ``torch.zeros`` copy of the table and then
    copies it into shared memory: a 256 MiB shared table's create peaked at 513 MiB of
    RSS. Its segments are made sparse (none of it committed at create: see
    ``test_shared_footprint.py``), and nothing is built beside them."""
    script = SHARED_PEAK.replace("ROOT", repr(str(tmp_path / "data")))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["shared"] and got["zero"], got
    assert got["grew"] < CAPACITY * ITEM + 64 * MiB, got["grew"] / MiB  # once, not twice
