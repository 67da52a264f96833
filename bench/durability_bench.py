"""What crash durability costs a memmap table (the default backend), per call.

Three ways to run the shipped schemas' tables on memmap, measured in the same
run, interleaved, medians of the rounds:

* ``volatile``: rows in memmap files, state (slots, priorities, counters) in
  RAM only - what tdreplay did before crash durability: ``kill -9`` lost the
  table.
* ``durable`` (the default): state in memory-mapped files beside the rows, a
  checksummed record per call - every acknowledged extend survives ``kill -9``.
* ``fsync``: ``durable`` plus a disk flush of rows and state before each
  extend and sample returns (``--fsync always``; survives a power loss).

    python bench/durability_bench.py            # full
    python bench/durability_bench.py --quick    # short
Writes bench/results/durability.json (``--json FILE`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import entry, machine  # noqa: E402

from tdreplay.storage import Table, TableSpec  # noqa: E402
from tdreplay.storage.spec import RateLimiterSpec  # noqa: E402
from tdreplay.storage.table import base as table_module  # noqa: E402  (where Table looks it up)

MODES = ("volatile", "durable", "fsync")


def make(spec: TableSpec, root: str, mode: str) -> Table:
    if mode == "volatile":
        original = table_module.DurableState.create
        table_module.DurableState.create = staticmethod(lambda folder, table: None)  # type: ignore[method-assign]
        try:
            table = Table.create(spec, root)
        finally:
            table_module.DurableState.create = original  # type: ignore[method-assign]
        return table
    table = Table.create(spec, root)
    table.fsync = mode == "fsync"
    return table


def rows(spec: TableSpec, n: int) -> TensorDict:
    td = TensorDict(batch_size=[n])
    for key, (shape, dtype) in spec.torch_schema().items():
        if dtype.is_floating_point:
            value = torch.rand(n, *shape).to(dtype)
        elif dtype == torch.bool:
            value = torch.rand(n, *shape) > 0.5
        else:
            value = torch.randint(0, 100, (n, *shape), dtype=dtype)
        td.set(key, value)
    return td


def rate(fn: Any, items: int, seconds: float) -> float:
    done = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        done += items
    return done / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--json", "--out", dest="out", default=str(REPO / "bench" / "results" / "durability.json")
    )
    args = p.parse_args()
    # short windows, many rounds: a long run of memmap extends measures the disk's writeback
    # (dirty pages past vm.dirty_ratio throttle the writer), the same with or without durability
    seconds, rounds = (0.2, 3) if args.quick else (0.3, 7)
    # samples first, atari extends last: those write GB/s into memmap files, and the kernel's
    # writeback of them slows what runs next (reads included) on a slow disk
    workloads = [
        ("cartpole", "sample", 32),
        ("atari", "sample", 32),
        ("cartpole", "extend", 1),
        ("cartpole", "extend", 64),
        ("atari", "extend", 64),
    ]
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, op, n in workloads:
            spec = TableSpec.from_file(REPO / "schemas" / f"{name}.yaml")
            # the schema's rate limiter would hold a run of extends back: this measures storage
            spec = spec.model_copy(
                update={
                    "capacity": 2_000 if name == "atari" else 100_000,
                    "rate_limiter": RateLimiterSpec(),
                }
            )
            label = f"{name} {op} {n}"
            results[label] = {m: [] for m in MODES}
            batch = rows(spec, n)
            for r in range(rounds):
                for mode in MODES:
                    root = f"{tmp}/{label.replace(' ', '-')}-{mode}-{r}"
                    table = make(spec, root, mode)
                    table.extend(rows(spec, 500))
                    if op == "extend":
                        fn = lambda t=table, b=batch: t.extend(b)  # noqa: E731
                    else:
                        fn = lambda t=table, n=n: t.sample(n)  # noqa: E731
                    # start each measurement with no dirty pages from the last one: the kernel
                    # writing back another run's rows would be measured instead of this run
                    os.sync()
                    results[label][mode].append(rate(fn, n, seconds))
                    table.destroy()
    out: dict[str, Any] = {"unit": "items/s, median of rounds", "rounds": rounds, "workloads": {}}
    print(
        f"{'workload':24} {'volatile':>12} {'durable':>12} {'fsync':>12} {'durable/volatile':>17}"
    )
    for label, by_mode in results.items():
        med = {m: statistics.median(v) for m, v in by_mode.items()}
        ratio = med["durable"] / med["volatile"]
        out["workloads"][label] = {**med, "durable_over_volatile": ratio}
        print(
            f"{label:24} {med['volatile']:12,.0f} {med['durable']:12,.0f} {med['fsync']:12,.0f} "
            f"{ratio:17.2f}"
        )
    out["entries"] = [
        e
        for label, v in out["workloads"].items()
        for e in (
            entry("durability", f"{label}: crash-durable", v["durable"], "items/s",
                  "state in RAM", v["volatile"]),
            entry("durability", f"{label}: --fsync always", v["fsync"], "items/s",
                  "crash-durable", v["durable"]),
        )
    ]  # fmt: skip
    out["machine"] = machine()
    out["command"] = " ".join(["python", "bench/durability_bench.py", *sys.argv[1:]])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
