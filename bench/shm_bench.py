"""Same-host transport benchmark: shared memory next to HTTP and TorchRL's in-process buffer.

    python bench/shm_bench.py                    # full run (~2 min)
    python bench/shm_bench.py --quick            # a smoke run (~25 s)
    python bench/shm_bench.py --json out.json    # also write every figure
    python bench/shm_bench.py --strict           # exit 1 when a goal fails

Starts one server (``python -m tdreplay.service serve``, shared-memory socket
on, default memmap backend, one torch thread) holding the shipped cartpole
and atari schemas, and four client processes apart from it, each with one
torch thread (BASELINES.md "Threads"). Through the public client API -
``ReplayClient(url, transport="shm")`` and ``transport="http"`` on the same
server and the same tables, the TensorDict the user gets included - it
measures:

1. atari sample, batch 256: shm vs HTTP vs TorchRL's in-process
   ``ReplayBuffer(LazyTensorStorage, RandomSampler)`` holding as many items of
   the same shapes (``rb.sample(256)``, which copies the batch out). A shm
   batch *views* a slot leased to the thread; "shm + clone" is the same call
   followed by ``batch.clone()``, for a learner that keeps its batches;
2. cartpole sample, batch 1: shm vs HTTP (per-call overhead);
3. atari extend, chunks of 64 rows: shm vs HTTP;
4. four learner processes sampling atari b256 through shm at once vs one:
   items/s summed over the learners, and the CPU seconds per second of the
   server and of the learners (``/proc/<pid>/stat`` for the server, in clock
   ticks; ``time.process_time`` in each learner);
5. what waking an idle CPU costs here, before the server starts: two bare
   processes on a socket pair, 50 us of work on one side and 40 on the other
   per round trip, both sleeping in ``recv`` for the other's message vs both
   polling for it (``tdreplay.system.poll``, what the same-host transport does
   for a client calling in a tight loop; see ``--shm-poll-us``).

Every workload runs each round, the transports compared taking turns in a
rotating order, so both see the same machine load; figures are medians over
rounds, ratios the median of the ratios within each round. The atari
schema's rate limiter (samples_per_insert 8) would hold a benchmark back: it
runs with ``min_size_to_sample: 1`` and a capacity of 4096, filled (its
prioritized sampler, fields and backend as shipped; TorchRL's buffer uses
its uniform ``RandomSampler``, which costs less). Figures vary +-25% when
other work shares the cores; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import workers  # bench/ on sys.path
from common import MARK, cpu_seconds, entry, free_port, machine, schemas, stop, write_json
from wake_cost import wake_cost

HERE = Path(__file__).resolve().parent
LEARNERS = 4
ATARI_ITEMS = 4096  # the capacity compare_trees.schemas gives atari: filled to it
CARTPOLE_ITEMS = 10_000

#: (workload, case, batch): the cases compared with each other, a group per workload
GROUPS: list[tuple[str, list[str], int]] = [
    ("atari sample b256", ["shm", "http", "torchrl", "shm + clone"], 256),
    ("cartpole sample b1", ["shm", "http"], 1),
    ("atari extend b64", ["shm", "http"], 64),
    ("atari sample b256, learners", ["1 learner", f"{LEARNERS} learners"], 256),
]
#: (workload, case, baseline case, goal): ratios case / baseline; goal None: reported only
RATIOS: list[tuple[str, str, str, float | None]] = [
    ("atari sample b256", "shm", "torchrl", 3.0),
    ("atari sample b256", "shm", "http", 3.0),
    ("atari sample b256", "shm + clone", "torchrl", None),
    ("atari sample b256", "http", "torchrl", None),
    ("cartpole sample b1", "shm", "http", 5.0),
    ("atari extend b64", "shm", "http", 2.0),
    ("atari sample b256, learners", f"{LEARNERS} learners", "1 learner", None),
]


# ------------------------------------------------------------------ worker side
def worker(url: str, fields: dict[str, Any], torchrl: bool) -> None:
    """A client process: answers JSON commands on stdin with ``MARK``-ed JSON lines."""
    import torch
    from client_bench import rows

    from tdreplay.client import ReplayClient

    torch.set_num_threads(1)
    spec = {t: {k: {"shape": s, "dtype": d} for k, (s, d) in f.items()} for t, f in fields.items()}
    shm = ReplayClient(url, transport="shm")
    http = ReplayClient(url, transport="http")
    rb: Any = None
    chunk = rows(spec["atari"], 64)
    cases: dict[str, Callable[[], Any]] = {
        "atari sample b256 shm": lambda: shm.sample("atari", 256),
        "atari sample b256 shm + clone": lambda: shm.sample("atari", 256).clone(),
        "atari sample b256 http": lambda: http.sample("atari", 256),
        "atari sample b256 torchrl": lambda: rb.sample(256),
        "cartpole sample b1 shm": lambda: shm.sample("cartpole", 1),
        "cartpole sample b1 http": lambda: http.sample("cartpole", 1),
        "atari extend b64 shm": lambda: shm.extend("atari", chunk),
        "atari extend b64 http": lambda: http.extend("atari", chunk),
    }

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(MARK + json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply({"ready": True, "transports": [shm.transport, http.transport]})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "fill":
            for _ in range(ATARI_ITEMS // 256):
                shm.extend("atari", rows(spec["atari"], 256))
            shm.extend("cartpole", rows(spec["cartpole"], CARTPOLE_ITEMS))
            if torchrl:
                from torchrl.data import LazyTensorStorage, ReplayBuffer
                from torchrl.data.replay_buffers.samplers import RandomSampler

                logging.getLogger("torchrl").setLevel(logging.WARNING)

                rb = ReplayBuffer(
                    storage=LazyTensorStorage(ATARI_ITEMS), sampler=RandomSampler(), batch_size=256
                )
                for _ in range(ATARI_ITEMS // 256):
                    rb.extend(rows(spec["atari"], 256))
            reply({"filled": True})
        elif cmd["op"] == "warm":
            for name in cmd["cases"]:
                for _ in range(3):
                    cases[name]()
            reply({"warm": True})
        elif cmd["op"] == "run":
            call = cases[cmd["case"]]
            call()
            if cmd["start"] is not None:  # several learners start together
                time.sleep(max(0.0, cmd["start"] - time.monotonic()))
            c0, t0 = time.process_time(), time.monotonic()
            end, n = t0 + cmd["seconds"], 0
            while True:
                call()
                n += 1
                if (now := time.monotonic()) >= end:
                    break
            reply({"calls": n, "wall": now - t0, "cpu": time.process_time() - c0})
    shm.close()
    http.close()


# ------------------------------------------------------------------ main side
class Worker(workers.Worker):
    """A client process of :func:`worker`, driven over its stdin/stdout."""

    def __init__(self, url: str, fields: dict[str, Any], torchrl: bool) -> None:
        arg = json.dumps([url, fields, torchrl])
        super().__init__([sys.executable, str(Path(__file__).resolve()), "--worker", arg])


def measure(workers: list[Worker], server: int, case: str, n: int, seconds: float) -> dict:
    """One timed run of ``case`` on the first ``n`` workers, started together."""
    start = time.monotonic() + 0.3 if n > 1 else None
    s0 = cpu_seconds(server)
    for w in workers[:n]:
        w.send({"op": "run", "case": case, "seconds": seconds, "start": start})
    if start is not None:  # the server idles until then; the warm-up calls are not counted
        time.sleep(max(0.0, start - time.monotonic()))
        s0 = cpu_seconds(server)
    got = [w.read() for w in workers[:n]]
    wall = statistics.mean(g["wall"] for g in got)
    return {
        "calls_per_s": sum(g["calls"] / g["wall"] for g in got),
        "server_cpu": (cpu_seconds(server) - s0) / wall,  # CPU seconds per second
        "client_cpu": sum(g["cpu"] / g["wall"] for g in got),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 rounds of 0.4 s per case")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=2.0, help="per case and round")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--strict", action="store_true", help="exit 1 when a goal fails")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(*json.loads(args.worker))
        return 0
    if args.quick:
        args.rounds, args.seconds = 3, 0.4
    from client_bench import wait_up

    t_start = time.perf_counter()
    info = machine()
    info["loadavg_start"] = info.pop("loadavg")
    procs: list[subprocess.Popen] = []
    runs: dict[tuple[str, str], list[dict]] = {}
    wakes = wake_cost(args.rounds, args.seconds / 2)
    with tempfile.TemporaryDirectory(prefix="tdreplay-shm-bench-") as tmp:
        work = Path(tmp)
        (work / "schemas").mkdir()
        fields = schemas(work / "schemas")
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "tdreplay.service", "serve", "--schema", str(work / "schemas"),
             "--root", str(work / "data"), "--port", str(port), "--log-level", "warning"],
        )  # fmt: skip
        procs.append(server)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_up(f"{url}/readyz", server, "tdreplay server")
            workers = [Worker(url, fields, torchrl=i == 0) for i in range(LEARNERS)]
            procs += [w.proc for w in workers]
            for w in workers:
                hello = w.hello
                if hello["transports"] != ["shm", "http"]:
                    raise RuntimeError(f"the clients' transports are {hello['transports']}")
            workers[0].ask({"op": "fill"})
            all_cases = [f"{wl} {c}" for wl, cs, _ in GROUPS[:3] for c in cs]
            workers[0].ask({"op": "warm", "cases": all_cases})
            for w in workers[1:]:
                w.ask({"op": "warm", "cases": ["atari sample b256 shm"]})
            print(
                f"# tdreplay shm bench ({'quick' if args.quick else 'full'}): {args.rounds} rounds "
                f"of {args.seconds:g} s per case; {info['cores']} cores, {info['cpu']}\n"
                f"# server pid {server.pid} (memmap, 1 torch thread), {LEARNERS} client processes; "
                f"atari {ATARI_ITEMS} items stored (server and TorchRL), cartpole {CARTPOLE_ITEMS}",
                flush=True,
            )
            for r in range(args.rounds):
                for workload, cases, _ in GROUPS:
                    for case in cases[r % len(cases) :] + cases[: r % len(cases)]:
                        if workload.endswith("learners"):
                            n = int(case.split()[0])
                            got = measure(
                                workers, server.pid, "atari sample b256 shm", n, args.seconds
                            )
                        else:
                            got = measure(
                                workers, server.pid, f"{workload} {case}", 1, args.seconds
                            )
                        runs.setdefault((workload, case), []).append(got)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            stop(procs)
    info["loadavg_end"] = os.getloadavg()
    return report(args, info, fields, runs, wakes, time.perf_counter() - t_start)


def report(
    args: argparse.Namespace, info: dict, fields: dict, runs: dict, wakes: dict, wall_s: float
) -> int:
    import torch

    batch = {wl: b for wl, _, b in GROUPS}
    item_mb = {
        table: sum(
            math.prod(shape) * torch.empty((), dtype=getattr(torch, dtype)).element_size()
            for shape, dtype in f.values()
        )
        / 1e6
        for table, f in fields.items()
    }

    def med(wl: str, case: str, key: str, scale: float = 1.0) -> float:
        return statistics.median(run[key] * scale for run in runs[(wl, case)])

    print(
        f"\n{'workload':<28} {'case':<12} {'items/s':>10} {'MB/s':>8} "
        f"{'server CPU':>10} {'client CPU':>10} {'server us/item':>14} {'client us/item':>14}"
    )
    for wl, cases, b in GROUPS:
        for case in cases:
            items = med(wl, case, "calls_per_s", b)
            mb = item_mb[wl.split()[0]]
            srv = med(wl, case, "server_cpu")
            cli = med(wl, case, "client_cpu")
            rs = runs[(wl, case)]
            srv_us = statistics.median(r["server_cpu"] / (r["calls_per_s"] * b) * 1e6 for r in rs)
            cli_us = statistics.median(r["client_cpu"] / (r["calls_per_s"] * b) * 1e6 for r in rs)
            print(
                f"{wl:<28} {case:<12} {items:>10,.0f} {items * mb:>8,.1f} "
                f"{srv:>10.2f} {cli:>10.2f} {srv_us:>14.1f} {cli_us:>14.1f}"
            )
    print("(CPU: CPU seconds per second, summed over the case's processes; torchrl: in-process)")

    entries: list[dict[str, Any]] = []
    print("\nratios (median of the per-round ratios):")
    for wl, case, base, goal in RATIOS:
        pairs = zip(runs[(wl, case)], runs[(wl, base)], strict=True)
        ratio = statistics.median(a["calls_per_s"] / b["calls_per_s"] for a, b in pairs)
        ok = None if goal is None else ratio >= goal
        mark = "    " if ok is None else ("PASS" if ok else "FAIL")
        want = f" (goal >= {goal:g}x)" if goal is not None else ""
        print(f"  {mark}  {wl}: {case} / {base} = {ratio:.2f}x{want}")
        entries.append(
            entry(
                "shm",
                f"{wl}: {case}",
                med(wl, case, "calls_per_s", batch[wl]),
                "items/s",
                base,
                med(wl, base, "calls_per_s", batch[wl]),
                ratio=ratio,
                goal=goal,
            )
        )
    wl = "atari sample b256, learners"
    one, many = "1 learner", f"{LEARNERS} learners"
    print(f"\n{wl}: CPU seconds per second (server / learners, and the server's share)")
    for who in ("server_cpu", "client_cpu"):
        a, b = med(wl, many, who), med(wl, one, who)
        name = "server" if who == "server_cpu" else "learners"
        entries.append(entry("shm", f"{wl}: {many}, {name} CPU", a, "CPU s/s", one, b))
    for case in (one, many):
        srv, cli = med(wl, case, "server_cpu"), med(wl, case, "client_cpu")
        print(
            f"  {case:<12} server {srv:.2f}  learners {cli:.2f}  server share {srv / (srv + cli):.0%}"
        )
    sleep, poll = (statistics.median(wakes[k]) for k in ("sleep", "poll"))
    ratio = statistics.median(p / s for p, s in zip(wakes["poll"], wakes["sleep"], strict=True))
    work = "two bare processes, 90 us of work per round trip"
    print(
        f"\n{work}: {sleep:,.0f}/s sleeping for the other's message, {poll:,.0f}/s polling "
        f"({ratio:.2f}x; a wake-up costs ~{(1 / sleep - 1 / poll) / 2 * 1e6:.0f} us here)"
    )
    entries.append(entry("shm", f"{work}: both poll", poll, "round trips/s", "both sleep",
                         sleep, ratio=ratio))  # fmt: skip
    goals = [e for e in entries if e["goal"] is not None]
    print(f"\n{sum(e['pass'] for e in goals)}/{len(goals)} goals met; {wall_s:.0f}s")
    if args.json:
        write_json(
            args.json,
            "shm",
            entries,
            machine=info,
            quick=args.quick,
            rounds=args.rounds,
            seconds=args.seconds,
            runs={f"{wl}: {case}": r for (wl, case), r in runs.items()},
            wakes=wakes,
            wall_s=wall_s,
        )
    return 1 if args.strict and not all(e["pass"] for e in goals) else 0


if __name__ == "__main__":
    sys.exit(main())
