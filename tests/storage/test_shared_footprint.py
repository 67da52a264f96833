"""A ``shared`` table takes shared memory (``/dev/shm``) as rows come, not its capacity at create.

Each case runs a script in a process of its own and measures what its ``/dev/shm``
files hold (``st_blocks`` of the open files under ``/dev/shm`` in ``/proc/self/fd``:
the process's own segments, whatever else the host runs). A full ``/dev/shm`` is a
4 MiB tmpfs mounted in a mount namespace of the script's own (needs root or
CAP_SYS_ADMIN: skipped with the reason where it is refused).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

MiB = 1 << 20
ITEM = 64 << 10  # 64 KiB items (x: 65528 uint8, id: int64)
CAPACITY = 4096  # 256 MiB in all
EXTENT = 64 * MiB  # storage/extents.py's MIN_EXTENT_BYTES
PAGES = 2 * 4096  # a segment per field holds whole pages: up to one more than its rows' bytes

PRELUDE = """
import json, os, torch
from pathlib import Path
from tensordict import TensorDict
from tdreplay.storage import InsufficientStorage, Table, TableSpec

def committed():
    total = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            if os.readlink(fd).startswith("/dev/shm/"):
                total += os.stat(fd).st_blocks * 512
        except OSError:
            pass
    return total

def spec(name, capacity, **backend):
    return TableSpec.model_validate({"name": name, "capacity": capacity,
        "backend": {"kind": "shared", **backend},
        "fields": {"x": {"shape": [65528], "dtype": "uint8"}, "id": {"shape": [], "dtype": "int64"}}})

def rows(start, n):
    return TensorDict({"x": torch.full((n, 65528), start % 251 + 1, dtype=torch.uint8),
                       "id": torch.arange(start, start + n)}, [n])
"""


def run(script: str, root: Path, *, shm_mib: int | None = None) -> dict[str, Any]:
    """Run ``PRELUDE + script`` (``ROOT``: a data root) from a file beside ``root`` and
    return the JSON it prints last; with ``shm_mib``, under a ``/dev/shm`` of that many MiB."""
    file = root.parent / "script.py"
    file.write_text(PRELUDE + script.replace("ROOT", repr(str(root))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    cmd = [sys.executable, str(file)]
    if shm_mib is not None:
        unshare = shutil.which("unshare")
        if unshare is None:
            pytest.skip("no unshare(1) here")
        mount = f"mount -t tmpfs -o size={shm_mib}m tmpfs /dev/shm"
        cmd = [unshare, "-m", "sh", "-c",
               f'mount --make-rprivate / && {mount} && exec "$0" "$1"', *cmd]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    refused = "mount" in done.stderr or "unshare" in done.stderr
    if shm_mib is not None and done.returncode != 0 and "Traceback" not in done.stderr and refused:
        pytest.skip(f"cannot mount a tmpfs on /dev/shm here: {done.stderr.strip()}")
    assert done.returncode == 0, f"exit {done.returncode} (SIGBUS: -7)\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


GROWS = """
import torch.multiprocessing as mp

def child(q, back):
    t = q.get()  # attached by descriptor (torch's reductions), as any process does
    t[2000, :4] = 7  # the table sees it: the same pages
    back.put([int(t[0].sum()), int(t[1499].sum()), t.is_shared()])

def main():
    out = {}
    table = Table.create(spec("s", 4096), ROOT)
    out["created"] = committed()
    out["created_reserved"] = table.info()["stats"]["reserved_bytes"]
    table.extend(rows(0, 1000))
    table.extend(rows(1000, 500))
    out["rows"] = committed()
    out["reserved"] = table.info()["stats"]["reserved_bytes"]
    out["capacity_bytes"] = table.info()["stats"]["capacity_bytes"]
    x = table.backend.tensors[("x",)]
    out["shared"] = x.is_shared() and table.backend.tensors[("id",)].is_shared()
    out["unwritten_zero"] = not bool(table.read(torch.tensor([4095]))["x"].any())
    out["read"] = table.read(torch.tensor([0, 1499]))["id"].tolist()
    ctx = mp.get_context("spawn")
    q, back = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, back), daemon=True)
    p.start()
    q.put(x)
    out["child"] = back.get(timeout=120)
    p.join(30)
    out["seen"] = x[2000, :4].tolist()
    table.checkpoint(Path(ROOT) / "ckpt")
    table.destroy()
    del table, x
    restored = Table.restore(Path(ROOT) / "ckpt", Path(ROOT) / "again")
    out["restored"] = committed()
    out["restored_ids"] = restored.read(torch.tensor([0, 1499]))["id"].tolist()
    out["restored_reserved"] = restored.info()["stats"]["reserved_bytes"]
    restored.destroy()
    print(json.dumps(out))

if __name__ == "__main__":  # not in the child, which imports this file
    main()
"""


def test_a_shared_table_takes_shared_memory_as_rows_come(tmp_path: Path) -> None:
    """A shared table was its capacity of ``/dev/shm`` from create on (``share_memory_()``
    copied the whole table into fresh segments): 256 MiB before a row. It holds next to
    nothing when created, the rows written plus at most one extent ahead once they come
    (``reserved_bytes`` says the same), is still made of torch shared-memory tensors
    another process attaches to, and a checkpoint restores into what its rows need."""
    got = run(GROWS, tmp_path / "data")
    assert got["created"] < MiB and got["created_reserved"] < MiB, got
    written = 1500 * ITEM
    assert written <= got["rows"] <= written + EXTENT, got["rows"] / MiB
    assert 0 <= got["rows"] - got["reserved"] < PAGES, got  # reserved_bytes: what /dev/shm holds
    assert got["capacity_bytes"] == CAPACITY * ITEM
    assert got["shared"] and got["unwritten_zero"], got
    assert got["read"] == [0, 1499]
    assert got["child"] == [1 * 65528, (1000 % 251 + 1) * 65528, True], got["child"]
    assert got["seen"] == [7, 7, 7, 7]
    assert written <= got["restored"] <= written + EXTENT, got["restored"] / MiB
    assert 0 <= got["restored"] - got["restored_reserved"] < PAGES, got
    assert got["restored_ids"] == [0, 1499]


PREALLOCATED = """
out = {}
for name, how in (("spec", {"preallocate": True}), ("flag", {})):
    before = committed()
    table = Table.create(spec(name, 256, **how), ROOT, preallocate=not how)
    out[name] = [committed() - before, table.info()["stats"]["reserved_bytes"]]
    table.destroy()
    del table
print(json.dumps(out))
"""


def test_preallocate_reserves_a_shared_tables_capacity_at_create(tmp_path: Path) -> None:
    """``backend.preallocate`` (the spec's) and ``preallocate=True`` (the server's
    ``--preallocate``) reserve the whole capacity of ``/dev/shm`` at create."""
    got = run(PREALLOCATED, tmp_path / "data")
    for committed, reserved in got.values():
        assert reserved == 256 * ITEM and 0 <= committed - reserved < PAGES, got


NO_ROOM = """
out = {}
table = Table.create(spec("s", 256), ROOT)  # 16 MiB of rows, /dev/shm holds 4 MiB
out["created"] = committed()
table.extend(rows(0, 32))  # 2 MiB: the first extent (64 MiB) does not fit, these rows do
try:
    table.extend(rows(32, 64))  # 4 MiB more: no room
except InsufficientStorage as err:
    out["error"] = [type(err).__name__, err.message]
out["size"] = table.size
out["rows"] = committed()
out["ids"] = table.sample(64)["id"].max().item()
out["x"] = table.read(torch.arange(32))["x"].float().mean().item()
table.extend(rows(32, 8))  # what fits still goes in
out["size_after"] = table.size
try:
    Table.create(spec("p", 256, preallocate=True), ROOT)
except InsufficientStorage as err:
    out["preallocate"] = err.message
print(json.dumps(out))
"""


def test_a_full_dev_shm_is_insufficient_storage_before_rows_land(tmp_path: Path) -> None:
    """A shared table larger than ``/dev/shm`` was refused at create (its capacity was
    committed then); once shared memory is taken as rows come, a write into a page the
    tmpfs has no room for would end the process with SIGBUS. The pages are reserved
    ahead of the writes: an insert past the room is an ``InsufficientStorage`` naming
    shared memory and its remedy, before any of its rows lands; the table keeps serving
    what it holds and takes what fits. With ``preallocate`` the create is refused."""
    got = run(NO_ROOM, tmp_path / "data", shm_mib=4)
    assert got["created"] < MiB, got
    kind, detail = got["error"]
    assert kind == "InsufficientStorage"
    assert "shared memory" in detail and "/dev/shm" in detail and "--shm-size" in detail, detail
    assert str(tmp_path) not in detail, detail
    assert got["size"] == 32 and 0 <= got["rows"] - 32 * ITEM < PAGES, got  # none of the 64
    assert got["ids"] < 32 and got["x"] == 1.0, got
    assert got["size_after"] == 40, got
    assert "shared memory" in got["preallocate"] and "--shm-size" in got["preallocate"], got


SPLIT = """
KiB = 1 << 10
fields = {"a": {"shape": [62 * KiB], "dtype": "uint8"}, "b": {"shape": [8 * KiB], "dtype": "uint8"}}
table = Table.create(TableSpec.model_validate({"name": "two", "capacity": 128,
    "backend": {"kind": "shared"}, "fields": fields}), ROOT)

def batch(n):
    return TensorDict({"a": torch.ones(n, 62 * KiB, dtype=torch.uint8),
                       "b": torch.ones(n, 8 * KiB, dtype=torch.uint8)}, [n])

out = {"errors": []}
for n in (64, 32, 16, 8, 4, 2, 1):
    while True:
        try:
            table.extend(batch(n))
        except InsufficientStorage as err:
            out["errors"].append(err.message)
            break
    out.setdefault("first", table.size)
out["size"] = table.size
out["rows"] = committed()
out["reserved"] = table.info()["stats"]["reserved_bytes"]
print(json.dumps(out))
"""


def test_a_reservation_that_does_not_fit_leaves_no_field_holding_pages(tmp_path: Path) -> None:
    """An extent is reserved field by field. The first field's share of one that does not
    fit was reserved and kept when the next field's was refused: with a 62 KiB and an
    8 KiB field under an 8 MiB ``/dev/shm``, the first insert of 64 rows (4.4 MiB) into an
    empty table was a 507, and 7.75 MiB of ``/dev/shm`` stayed taken with
    ``reserved_bytes`` 0. The rows an insert needs are reserved first, an extent ahead only
    as far as the room holds: the table fills ``/dev/shm``, and what it holds is what
    ``reserved_bytes`` says."""
    got = run(SPLIT, tmp_path / "data", shm_mib=8)
    assert got["first"] >= 64, got  # the first insert fits
    row = 70 << 10
    assert got["size"] >= (8 * MiB - 2 * PAGES) // row, got  # /dev/shm filled with rows
    assert all("shared memory" in e for e in got["errors"]), got["errors"]
    assert 0 <= got["rows"] - got["reserved"] < PAGES, got  # nothing taken beyond it
