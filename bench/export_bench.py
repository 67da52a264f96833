"""Exports over HTTP: throughput and memory, the file held in memory (before) and streamed (after).

A real server (``python -m tdreplay.service serve``, memmap table) holds a
table of ``--gb`` gigabytes (rows of a 1024-float32 observation plus a few
scalars); a client in a process of its own exports it over HTTP to a local
file, as Parquet and as CSV (CSV on an eighth of the rows: text is ~3x the
bytes), two ways:

* **before**: ``client.export(table)`` returns the file's bytes, then they are
  written (what ``client.export(dest=...)`` and ``tdreplay export -o`` did);
* **after**: ``client.export(table, dest=FILE)`` streams the body into a
  hidden file beside FILE, 1 MiB at a time, and renames it at the end;
* **async**: the same with ``AsyncReplayClient``, over its own transport (it ran
  the blocking client in a thread before: the blocking figures).

Figures per way and format: GB/s (file bytes / wall time of the call), the
client's peak RSS growth during the call (``VmRSS`` sampled every 10 ms
from the call's start), and the server's peak growth of anonymous memory
(``RssAnon``, sampled every 10 ms; the table's memmap pages the export reads
are page cache, shown apart as ``VmRSS``), the highest of its runs (its
side is the same in all). The goal (issue 20): at most 256 MB growth on
either side.

    python bench/export_bench.py            # a 4 GB table
    python bench/export_bench.py --quick    # 0.5 GB
    python bench/export_bench.py --gb 10    # the issue's 10 GB (needs ~3x that of disk)
    python bench/export_bench.py --gb 10 --streamed-only --json bench/results/export-10gb.json
                                            # the streamed way only: "before" holds the
                                            # whole file in the client's memory

Writes bench/results/export.json (``--json FILE`` elsewhere). Everything it writes is
under a scratch folder, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from common import bound_entry, entry, free_port, print_entries, wait_up, write_json  # noqa: E402

MB = 1 << 20
GOAL_GROWTH = 256 * MB
OBS = 1024  # float32 elements per row: 4 KiB of the row's ~4.1 KiB


def status(pid: int | str, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


class Peak(threading.Thread):
    """The highest ``RssAnon`` / ``VmRSS`` of a process while it runs, sampled every 10 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.done = pid, threading.Event()
        self.anon0, self.rss0 = status(pid, "RssAnon"), status(pid, "VmRSS")
        self.anon, self.rss = self.anon0, self.rss0

    def run(self) -> None:
        while not self.done.wait(0.01):
            self.anon = max(self.anon, status(self.pid, "RssAnon"))
            self.rss = max(self.rss, status(self.pid, "VmRSS"))

    def stop(self) -> tuple[int, int]:
        self.done.set()
        self.join()
        return self.anon - self.anon0, self.rss - self.rss0


def client_worker(url: str, table: str, fmt: str, way: str, dest: str) -> None:
    """One export in this process; prints ``{"seconds", "bytes", "growth"}`` as JSON."""
    if way == "async":
        seconds, anon, rss = asyncio.run(_async_export(url, table, fmt, dest))
    else:
        seconds, anon, rss = _export(url, table, fmt, way, dest)
    size = Path(dest).stat().st_size
    print(json.dumps({"seconds": seconds, "bytes": size, "growth": rss, "growth_anon": anon}))


def _export(url: str, table: str, fmt: str, way: str, dest: str) -> tuple[float, int, int]:
    from tdreplay.client import ReplayClient

    with ReplayClient(url, timeout=3600) as client:
        client.info(table)  # connected, everything imported
        peak = Peak(os.getpid())
        peak.start()
        start = time.perf_counter()
        if way == "before":
            data = client.export(table, fmt)
            Path(dest).write_bytes(data)
            del data
        else:
            client.export(table, fmt, dest=dest)
        seconds = time.perf_counter() - start
        return seconds, *peak.stop()


async def _async_export(url: str, table: str, fmt: str, dest: str) -> tuple[float, int, int]:
    from tdreplay.client import AsyncReplayClient

    async with AsyncReplayClient(url, timeout=3600) as client:
        await client.info(table)
        peak = Peak(os.getpid())
        peak.start()
        start = time.perf_counter()
        await client.export(table, fmt, dest=dest)
        seconds = time.perf_counter() - start
        return seconds, *peak.stop()


def fill(url: str, table: str, rows: int) -> None:
    import torch
    from tensordict import TensorDict

    from tdreplay.client import ReplayClient

    spec = {
        "name": table,
        "capacity": rows,
        "backend": {"kind": "memmap"},
        "fields": {
            "observation": {"shape": [OBS], "dtype": "float32"},
            "action": {"shape": [], "dtype": "int64"},
            "next.reward": {"shape": [1], "dtype": "float32"},
            "next.done": {"shape": [1], "dtype": "bool"},
        },
    }
    step = 4096
    with ReplayClient(url, timeout=600) as client:
        client.create_table(spec)
        for lo in range(0, rows, step):
            n = min(step, rows - lo)
            client.extend(
                table,
                TensorDict(
                    {
                        "observation": torch.randn(n, OBS),
                        "action": torch.arange(lo, lo + n),
                        "next": {
                            "reward": torch.rand(n, 1),
                            "done": torch.rand(n, 1) < 0.01,
                        },
                    },
                    [n],
                ),
            )


def export_once(url: str, pid: int, table: str, fmt: str, way: str, dest: Path) -> dict[str, Any]:
    peak = Peak(pid)
    peak.start()
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--client-worker", url, table, fmt, way, str(dest)],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        anon, rss = peak.stop()
    result = json.loads(out.stdout.strip().splitlines()[-1])
    dest.unlink()
    return {**result, "server_anon": anon, "server_rss": rss}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a 0.5 GB table")
    p.add_argument("--gb", type=float, help="table size in GB (default 4; --quick 0.5)")
    p.add_argument("--json", type=Path, default=HERE / "results" / "export.json")
    p.add_argument(
        "--streamed-only",
        action="store_true",
        help="skip the held-in-memory way (a table larger than the client's memory)",
    )
    p.add_argument("--client-worker", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client_worker:
        client_worker(*args.client_worker)
        return
    gb = args.gb or (0.5 if args.quick else 4.0)
    row_bytes = OBS * 4 + 8 + 4 + 1
    rows = int(gb * 1e9 / row_bytes)
    scratch = Path(tempfile.mkdtemp(prefix="tdreplay-export-bench-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "tdreplay.service", "serve", "--root", str(scratch / "root"),
         "--port", str(port), "--log-level", "warning", "--max-body-bytes", str(256 * MB)],
        cwd=REPO,
    )  # fmt: skip
    entries: list[dict[str, Any]] = []
    runs: dict[str, Any] = {}
    try:
        wait_up(f"{url}/readyz", server, "tdreplay serve", timeout=600)
        began = time.perf_counter()
        fill(url, "big", rows)
        fill(url, "csv", rows // 8)
        print(f"filled {rows} + {rows // 8} rows in {time.perf_counter() - began:.0f} s")
        for fmt, table in (("parquet", "big"), ("csv", "csv")):
            ways = ("after", "async") if args.streamed_only else ("before", "after", "async")
            for way in ways:
                r = export_once(url, server.pid, table, fmt, way, scratch / f"out.{fmt}")
                runs[f"{fmt} {way}"] = r
                print(f"{fmt} {way}: {json.dumps(r)}")
            after, aio = runs[f"{fmt} after"], runs[f"{fmt} async"]
            before = runs.get(f"{fmt} before")
            size = f"{after['bytes'] / 1e9:.2f} GB {fmt}"
            entries.append(
                entry(
                    "export",
                    f"export {size} over HTTP, streamed to a file",
                    after["bytes"] / after["seconds"] / 1e9,
                    "GB/s",
                    None if before is None else "held in memory, then written",
                    None if before is None else before["bytes"] / before["seconds"] / 1e9,
                )
            )
            e = bound_entry(
                "export", f"client RSS growth, {size} (streamed)", after["growth"] / MB, "MB",
                GOAL_GROWTH / MB, most=True,
            )  # fmt: skip
            if before is not None:
                e["before"] = before["growth"] / MB
            entries.append(e)
            entries.append(
                entry(
                    "export",
                    f"async client: export {size}, streamed to a file",
                    aio["bytes"] / aio["seconds"] / 1e9,
                    "GB/s",
                    "the blocking client (what it ran, in a thread)",
                    after["bytes"] / after["seconds"] / 1e9,
                )
            )
            e = bound_entry(
                "export", f"async client RSS growth, {size}", aio["growth"] / MB, "MB",
                GOAL_GROWTH / MB, most=True,
            )  # fmt: skip
            entries.append(e)
            # the server does the same in every way: the highest of its runs (the first
            # export of a process also grows the allocator's arenas)
            done = [r for r in (before, after, aio) if r is not None]
            grown = max(r["server_anon"] for r in done)
            e = bound_entry(
                "export", f"server RssAnon growth, {size} (any way)", grown / MB, "MB",
                GOAL_GROWTH / MB, most=True,
            )  # fmt: skip
            e["server_vmrss_growth_mb"] = max(r["server_rss"] for r in done) / MB
            entries.append(e)
    finally:
        server.terminate()
        server.wait(60)
        shutil.rmtree(scratch, ignore_errors=True)
    print_entries(entries)
    write_json(args.json, "export", entries, runs=runs, gb=gb, rows=rows)


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # the server stopped and the scratch deleted on the way out


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    main()
