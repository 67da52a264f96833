"""The HTTP client path, as a user runs it, next to raw loopback HTTP and TorchRL's in-process buffer.

    python bench/http_bench.py                  # full run (~4 min)
    python bench/http_bench.py --quick          # a smoke run (~1.5 min)
    python bench/http_bench.py --json bench/results/http.json   # what the README renders
    python bench/http_bench.py --strict         # exit 1 when a goal fails

One tdreplay server (``python -m tdreplay.service serve``: the shipped
cartpole (11 fields) and atari schemas on the default memmap backend, see
``common.schemas``) and one client process (``tdreplay_cases.py``) using
the public ``ReplayClient(url, transport="http")``, batches decoded into
TensorDicts, one torch thread. Workloads, for cartpole and atari:
``sample`` one call per batch (b1, b32, b256), ``loader`` with prefetch 4,
``loader(stream=True)``, ``writer(chunk=256)`` fed step by step, and
``extend`` of 256-row batches. Baselines in the same run:

* **raw HTTP**: ``http.client`` on one keep-alive connection, against a bare
  Starlette app on the same loop and parser (uvloop, httptools), returning
  the very bytes of a tdreplay sample of that size (or reading the same
  Arrow extend body) into a reused buffer, without decoding them: what is
  left of a call when the replay work and the decode are taken out;
* **raw HTTP + gather** (atari b256): the same, the bare app first gathering
  the batch's two frame columns from memmap files into the body with
  ``index_select``, as the memmap backend does: the least a sample of 14 MB
  costs here (its memory traffic is the gather's, the socket's and the
  client's copies);
* **TorchRL**: ``ReplayBuffer(LazyTensorStorage, RandomSampler)`` of the
  same items in the client process, ``rb.sample(n)``, ``rb.extend(rows)``,
  ``rb.add(step)`` per step (the in-process buffer tdreplay replaces).

Every case runs once per round, the cases compared with each other back to
back in a rotating order; a figure is the median over rounds, a ratio the
median of the per-round ratios. Figures vary +-25% when other work shares
the cores: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    bound_entry,
    entry,
    failed,
    free_port,
    machine,
    print_entries,
    schemas,
    stop,
    wait_up,
    write_json,
)
from tdreplay_cases import RAW_APP
from workers import Worker, median_of, paired_ratio, run_rounds

HERE = Path(__file__).resolve().parent
TR = "tdreplay http"

#: (workload, our case, baseline case, goal): ratios ours / baseline, items/s
WORKLOADS: list[tuple[str, str, str, float | None]] = [
    ("cartpole sample b1", "cartpole sample b1", "raw http: cartpole sample b1", None),
    ("cartpole sample b1", "cartpole sample b1", "torchrl: cartpole sample b1", None),
    ("cartpole sample b32", "cartpole sample b32", "raw http: cartpole sample b32", None),
    ("cartpole sample b32", "cartpole sample b32", "torchrl: cartpole sample b32", None),
    ("cartpole sample b256", "cartpole sample b256", "raw http: cartpole sample b256", None),
    ("cartpole sample b256", "cartpole sample b256", "torchrl: cartpole sample b256", None),
    ("cartpole loader b1", "cartpole loader b1", "torchrl: cartpole sample b1", None),
    ("cartpole loader(stream=True) b1", "cartpole stream b1", "torchrl: cartpole sample b1", None),
    ("cartpole loader b32", "cartpole loader b32", "torchrl: cartpole sample b32", None),
    ("cartpole loader b256", "cartpole loader b256", "torchrl: cartpole sample b256", None),
    ("atari sample b32", "atari sample b32", "raw http: atari sample b32", None),
    ("atari sample b32", "atari sample b32", "torchrl: atari sample b32", None),
    ("atari sample b256", "atari sample b256", "raw http: atari sample b256", 0.7),
    ("atari sample b256", "atari sample b256", "raw http + gather: atari sample b256", None),
    ("atari sample b256", "atari sample b256", "torchrl: atari sample b256", None),
    ("atari loader b256", "atari loader b256", "torchrl: atari sample b256", None),
    ("cartpole writer(chunk=256)", "cartpole writer", "torchrl: cartpole add", None),
    ("atari writer(chunk=256)", "atari writer", "torchrl: atari add", None),
    ("cartpole extend b256", "cartpole extend b256", "raw http: cartpole extend b256", None),
    ("cartpole extend b256", "cartpole extend b256", "torchrl: cartpole extend b256", None),
    ("atari extend b256", "atari extend b256", "raw http: atari extend b256", None),
    ("atari extend b256", "atari extend b256", "torchrl: atari extend b256", None),
]
#: cases run back to back, each round in a rotating order
GROUPS: list[list[str]] = [
    [f"{TR}: cartpole sample b1", f"{TR}: cartpole loader b1", f"{TR}: cartpole stream b1",
     "raw http: cartpole sample b1", "torchrl: cartpole sample b1"],
    [f"{TR}: cartpole sample b32", f"{TR}: cartpole loader b32", "raw http: cartpole sample b32",
     "torchrl: cartpole sample b32"],
    [f"{TR}: cartpole sample b256", f"{TR}: cartpole loader b256",
     "raw http: cartpole sample b256", "torchrl: cartpole sample b256"],
    [f"{TR}: atari sample b32", "raw http: atari sample b32", "torchrl: atari sample b32"],
    [f"{TR}: atari sample b256", f"{TR}: atari loader b256", "raw http: atari sample b256",
     "raw http + gather: atari sample b256", "torchrl: atari sample b256"],
    [f"{TR}: cartpole writer", f"{TR}: cartpole extend b256", "raw http: cartpole extend b256",
     "torchrl: cartpole extend b256", "torchrl: cartpole add"],
    [f"{TR}: atari writer", f"{TR}: atari extend b256", "raw http: atari extend b256",
     "torchrl: atari extend b256", "torchrl: atari add"],
]  # fmt: skip
STREAM_GOAL = 10_000  # items/s: cartpole loader(stream=True) at batch 1
P50_GOAL_MS = 2.0  # cartpole sample b32, one call's latency (median)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 rounds of 0.4 s per case")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.5, help="per case and round")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--strict", action="store_true", help="exit 1 when a goal fails")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 2, 0.4
    t_start = time.perf_counter()
    info = machine()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="tdreplay-http-bench-") as tmp:
        work = Path(tmp)
        fields = schemas(work / "schemas")
        try:
            port, raw_port = free_port(), free_port()
            server = subprocess.Popen(
                [sys.executable, "-m", "tdreplay.service", "serve", "--schema", str(work / "schemas"),
                 "--root", str(work / "data"), "--port", str(port), "--log-level", "warning"],
            )  # fmt: skip
            procs.append(server)
            # glibc's mmap threshold pinned as tdreplay's server pins it (BASELINES.md "Large
            # buffers and glibc"): without it, large bodies flip between two speeds
            malloc = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456"}
            raw = subprocess.Popen(
                [sys.executable, "-c", RAW_APP, str(raw_port), str(work)],
                env={**os.environ, **malloc},
            )
            procs.append(raw)
            url, raw_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{raw_port}"
            wait_up(f"{url}/readyz", server, "tdreplay server")
            wait_up(f"{raw_url}/readyz", raw, "raw HTTP app")
            worker = Worker([sys.executable, str(HERE / "tdreplay_cases.py")])
            procs.append(worker.proc)
            print("filling the tables ...", file=sys.stderr, flush=True)
            worker.ask(
                {"op": "setup", "url": url, "fields": fields, "transports": ["http"],
                 "raw_url": raw_url, "torchrl": True}
            )  # fmt: skip
            print(
                f"# tdreplay HTTP client path ({'quick' if args.quick else 'full'}): {args.rounds} "
                f"rounds of {args.seconds:g} s per case; {info['cores']} cores, {info['cpu']}",
                flush=True,
            )
            runs = run_rounds(GROUPS, lambda case: worker, args.rounds, args.seconds)
        finally:
            stop(procs)
    info["loadavg_end"] = list(os.getloadavg())
    entries = report(runs)
    wall = time.perf_counter() - t_start
    print(f"\n{wall:.0f}s")
    if args.json:
        write_json(
            args.json,
            "http",
            entries,
            machine=info,
            quick=args.quick,
            rounds=args.rounds,
            seconds=args.seconds,
            runs=runs,
            wall_s=wall,
        )
    return 1 if args.strict and failed(entries) else 0


def report(runs: dict[str, list[dict]]) -> list[dict[str, Any]]:
    entries = []
    for workload, ours, base, goal in WORKLOADS:
        a, b = runs[f"{TR}: {ours}"], runs[base]
        entries.append(
            entry(
                "http",
                workload,
                median_of(a),
                "items/s",
                base.split(":")[0],
                median_of(b),
                ratio=paired_ratio(a, b),
                goal=goal,
            )
        )
    stream = median_of(runs[f"{TR}: cartpole stream b1"])
    entries.append(
        bound_entry("http", "cartpole loader(stream=True) b1", stream, "items/s", STREAM_GOAL)
    )
    p50 = median_of(runs[f"{TR}: cartpole sample b32"], "p50_ms")
    entries.append(
        bound_entry("http", "cartpole sample b32, p50 latency", p50, "ms", P50_GOAL_MS, most=True)
    )
    print_entries(entries)
    return entries


if __name__ == "__main__":
    sys.exit(main())
