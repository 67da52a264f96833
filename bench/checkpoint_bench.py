"""Checkpoint benchmark: does sampling stall while a table is checkpointed?

Not a test: it prints sample latency with and without a checkpoint running,
the checkpoint's wall time, and PASS/FAIL against the goals::

    python bench/checkpoint_bench.py            # ~280 MB table, 3 repetitions
    python bench/checkpoint_bench.py --quick    # ~70 MB table
    python bench/checkpoint_bench.py --json out.json --strict

The table has the shipped ``schemas/atari.yaml`` fields (56 KB items) on the
``memmap`` backend (its default) under a temporary root, its capacity chosen
for ~280 MB, filled; its rate limiter is lifted so that sampling never waits
on it. A sampler thread calls ``sample(32)`` in a loop and times every call.
For each way of writing a checkpoint it measures (a) the latency p50/p99
while nothing else runs, (b) p50/p99/max of the calls that overlap a
checkpoint, and (c) the checkpoint's wall time. The two ways, run
interleaved repetition by repetition in the same process:

* ``snapshot``: today's checkpoint (state under the locks, rows copied in
  chunks outside them, copy-on-write for rows overwritten meanwhile);
* ``locked``: the way before, every row copied under the table's locks
  (``checkpoint._write(..., _stall=True)``, kept for this comparison only).

Figures are medians over the repetitions. Goals: p99 during a checkpoint
<= 2x the idle p99, and a checkpoint <= 1.5x as long as the locked one.
The JSON goes to ``bench/results/checkpoint.json`` unless ``--json`` says
otherwise.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from common import bound_entry, machine
from tensordict import TensorDict

from tdreplay.storage import Table, TableSpec
from tdreplay.storage.checkpoint import write as C

HERE = Path(__file__).resolve().parent
SCHEMA = HERE.parent / "schemas" / "atari.yaml"
BATCH = 32
P99_MAX_RATIO = 2.0  # p99 during a checkpoint / idle p99
TIME_MAX_RATIO = 1.5  # checkpoint wall time / the locked one's


def make_table(root: Path, target_bytes: int) -> Table:
    raw = yaml.safe_load(SCHEMA.read_text())
    raw.update(
        name="checkpoint_bench",
        backend={"kind": "memmap"},
        rate_limiter={"min_size_to_sample": 1},  # sampling never waits on inserts
    )
    capacity = target_bytes // TableSpec.model_validate(raw).item_nbytes
    spec = TableSpec.model_validate({**raw, "capacity": capacity})
    table = Table.create(spec, root=root, seed=0)
    chunk = 256
    gen = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (chunk, 84, 84, 4), dtype=torch.uint8, generator=gen)
    for start in range(0, capacity, chunk):
        n = min(chunk, capacity - start)
        table.extend(
            TensorDict(
                {
                    "observation": frames[:n],
                    "action": torch.arange(start, start + n),
                    "next": {
                        "observation": frames[:n].roll(1, 0),
                        "reward": torch.ones(n, 1),
                        "done": torch.zeros(n, 1, dtype=torch.bool),
                    },
                },
                batch_size=[n],
            )
        )
    return table


class Sampler:
    """A thread that samples in a loop and records ``(start, end)`` of every call."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.calls: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        out = self.table.sample(BATCH)
        while not self.stop.is_set():
            t0 = time.perf_counter()
            self.table.sample(BATCH, out=out)
            self.calls.append((t0, time.perf_counter()))

    def between(self, t0: float, t1: float) -> list[float]:
        """Latencies (s) of the calls that overlap ``[t0, t1]``."""
        return [b - a for a, b in list(self.calls) if b >= t0 and a <= t1]

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def one(table: Table, sampler: Sampler, out: Path, *, locked: bool, idle_s: float) -> dict:
    """Idle latency for ``idle_s``, then the latency during one checkpoint, and its wall time."""
    time.sleep(0.2)  # let the previous checkpoint's aftermath settle
    t0 = time.perf_counter()
    time.sleep(idle_s)
    idle = sampler.between(t0, time.perf_counter())
    t0 = time.perf_counter()
    C.write(table, out, ted2flat=False, _stall=locked)
    t1 = time.perf_counter()
    during = sampler.between(t0, t1)
    shutil.rmtree(out)
    return {
        "idle_p50_ms": pct(idle, 0.5) * 1e3,
        "idle_p99_ms": pct(idle, 0.99) * 1e3,
        "during_p50_ms": pct(during, 0.5) * 1e3,
        "during_p99_ms": pct(during, 0.99) * 1e3,
        "during_max_ms": max(during) * 1e3,
        "during_calls": len(during),
        "checkpoint_s": t1 - t0,
    }


def median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a ~70 MB table, 1 s idle windows")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median reported)")
    p.add_argument("--dir", type=Path, help="scratch folder (default: a temporary one)")
    p.add_argument("--json", type=Path, default=HERE / "results" / "checkpoint.json")
    p.add_argument("--strict", action="store_true", help="exit 1 when a goal fails")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # see BASELINES.md "Threads"
    target = (70 if args.quick else 280) * 10**6
    idle_s = 1.0 if args.quick else 3.0
    scratch = Path(tempfile.mkdtemp(prefix="tdreplay-ckpt-bench-", dir=args.dir))
    t_start = time.perf_counter()
    try:
        table = make_table(scratch / "root", target)
        nbytes = table.capacity * table.spec.item_nbytes
        print(f"table: {table.capacity} atari items, {nbytes / 1e6:.0f} MB, memmap", flush=True)
        sampler = Sampler(table)
        runs: dict[str, list[dict]] = {"locked": [], "snapshot": []}
        try:
            for rep in range(args.reps):
                for mode in ("locked", "snapshot"):
                    r = one(
                        table, sampler, scratch / "ckpt", locked=mode == "locked", idle_s=idle_s
                    )
                    runs[mode].append(r)
                    print(
                        f"rep {rep} {mode:8s} idle p50/p99 {r['idle_p50_ms']:.2f}/"
                        f"{r['idle_p99_ms']:.2f} ms  during p50/p99/max {r['during_p50_ms']:.2f}/"
                        f"{r['during_p99_ms']:.2f}/{r['during_max_ms']:.1f} ms "
                        f"({r['during_calls']} calls)  checkpoint {r['checkpoint_s']:.3f} s",
                        flush=True,
                    )
        finally:
            sampler.close()
            table.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    new, old = median_of(runs["snapshot"]), median_of(runs["locked"])
    ratios = {
        "snapshot_p99_during_over_idle": new["during_p99_ms"] / new["idle_p99_ms"],
        "locked_p99_during_over_idle": old["during_p99_ms"] / old["idle_p99_ms"],
        "snapshot_time_over_locked": new["checkpoint_s"] / old["checkpoint_s"],
    }
    goals = [
        {
            "goal": f"p99 during a checkpoint <= {P99_MAX_RATIO}x idle p99",
            "value": ratios["snapshot_p99_during_over_idle"],
            "pass": ratios["snapshot_p99_during_over_idle"] <= P99_MAX_RATIO,
        },
        {
            "goal": f"checkpoint time <= {TIME_MAX_RATIO}x the locked checkpoint's",
            "value": ratios["snapshot_time_over_locked"],
            "pass": ratios["snapshot_time_over_locked"] <= TIME_MAX_RATIO,
        },
    ]
    results: dict[str, Any] = {
        "bench": "checkpoint",
        "command": " ".join(["python", "bench/checkpoint_bench.py", *(argv or sys.argv[1:])]),
        "quick": args.quick,
        "table": {"items": table.capacity, "mb": nbytes / 1e6, "backend": "memmap"},
        "batch": BATCH,
        "reps": args.reps,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "snapshot": new,
        "locked": old,
        "ratios": ratios,
        "goals": goals,
        "entries": [
            bound_entry(
                "checkpoint",
                "p99 sample latency during a checkpoint / idle p99",
                ratios["snapshot_p99_during_over_idle"],
                "x",
                P99_MAX_RATIO,
                most=True,
            ),
            bound_entry(
                "checkpoint",
                "checkpoint time / the locked checkpoint's",
                ratios["snapshot_time_over_locked"],
                "x",
                TIME_MAX_RATIO,
                most=True,
            ),
        ],
        "machine": machine(),
        "runs": runs,
        "wall_s": time.perf_counter() - t_start,
    }
    print(json.dumps({k: results[k] for k in ("snapshot", "locked", "ratios")}, indent=2))
    for g in goals:
        print(f"{'PASS' if g['pass'] else 'FAIL'}  {g['goal']}: {g['value']:.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 1 if args.strict and not all(g["pass"] for g in goals) else 0


if __name__ == "__main__":
    sys.exit(main())
