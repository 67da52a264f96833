"""What a ``shared`` table costs in shared memory, and how fast rows go into it.

Not a test. A real server (``python -m tdreplay.service serve``) gets a 1M-row
cartpole and a 20k-row atari table on the ``shared`` backend (the shipped
schemas, through the public client over HTTP); after create and after rows, it
reports:

* **committed**: the blocks of the server's ``/dev/shm`` segments (``st_blocks`` of
  the open files under ``/dev/shm`` in ``/proc/<pid>/fd``): this server's alone,
  whatever else the host runs;
* ``Shmem`` of ``/proc/meminfo`` (the whole host: other work moves it too) and the
  server's ``VmRSS``.

Then extend throughput into a shared table in this process (``Table.extend``,
batches of 256, medians of 5 rounds): creating and filling a fresh table (the create
counted: it committed the whole table before), and again once it has wrapped around
(slots written before).

    python bench/shared_bench.py
    python bench/shared_bench.py --quick     # smaller tables

Writes bench/results/shared.json (``--json FILE`` elsewhere). Everything else it writes
is under a scratch folder, deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import entry, print_entries, write_json  # noqa: E402
from footprint_bench import Server, fill, rows_of, rss, spec_of  # noqa: E402

from tdreplay.client import ReplayClient  # noqa: E402
from tdreplay.storage import Table, TableSpec  # noqa: E402

MB = 1 << 20


def committed(pid: int) -> int:
    """Bytes of ``/dev/shm`` the open files of process ``pid`` hold."""
    total = 0
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd).startswith("/dev/shm/"):
                total += os.stat(fd).st_blocks * 512
        except OSError:
            continue
    return total


def shmem() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Shmem:"))


def shared(spec: dict[str, Any]) -> dict[str, Any]:
    return {**spec, "backend": {"kind": "shared"}}


def footprint(quick: bool, entries: list[dict[str, Any]]) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="tdreplay-shared-"))
    try:
        server = Server(scratch / "root")
        client = ReplayClient(server.url, transport="http")
        pid = server.proc.pid

        def show(what: str) -> None:
            for figure, value in (
                ("/dev/shm committed", committed(pid)),
                ("Shmem (whole host)", shmem()),
                ("server VmRSS", rss(pid)),
            ):
                entries.append(entry("shared", f"{figure}, {what}", value / MB, "MB"))

        show("server up")
        tables = (("cartpole", 100_000 if quick else 1_000_000, 100_000, 10_000),
                  ("atari", 5_000 if quick else 20_000, 2_000, 256))  # fmt: skip
        for name, capacity, n, chunk in tables:
            spec = shared(spec_of(name, capacity))
            client.create_table(spec)
            time.sleep(0.5)
            show(f"+ {capacity:,}-row {name} created")
            fill(client, name, spec, n, chunk)
            show(f"+ {n:,} {name} rows")
            info = client.info(name)["stats"]
            entries.append(entry("shared", f"reserved_bytes, {n:,} {name} rows",
                                 info["reserved_bytes"] / MB, "MB", "capacity_bytes",
                                 info["capacity_bytes"] / MB))  # fmt: skip
        server.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def throughput(quick: bool, entries: list[dict[str, Any]]) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="tdreplay-shared-"))
    try:
        for name, capacity in (("cartpole", 200_000), ("atari", 4_096)):
            if quick:
                capacity //= 4
            spec = TableSpec.model_validate(shared(spec_of(name, capacity)))
            batch = rows_of(spec_of(name, capacity), 256)
            fresh, wrapped = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                table = Table.create(spec, scratch / "root")
                for times in (fresh, wrapped):  # a fresh table, then its slots again
                    for _ in range(capacity // 256):
                        table.extend(batch)
                    times.append(capacity // 256 * 256 / (time.perf_counter() - t0))
                    t0 = time.perf_counter()
                table.destroy()
            for how, times in (("fresh", fresh), ("wrapped", wrapped)):
                what = f"extend {name} b256, {capacity:,}-row shared table, {how} (median of 5)"
                if how == "fresh":
                    what = what.replace("extend", "create + extend")
                entries.append(entry("shared", what, statistics.median(times), "items/s"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", type=Path, default=HERE / "results" / "shared.json")
    p.add_argument("--part", choices=["all", "footprint", "throughput"], default="all")
    args = p.parse_args(argv)
    entries: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    if args.part in ("all", "footprint"):
        footprint(args.quick, entries)
    if args.part in ("all", "throughput"):
        throughput(args.quick, entries)
    print_entries(entries)
    write_json(args.json, "shared", entries, quick=args.quick, wall_s=time.perf_counter() - t_all)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
