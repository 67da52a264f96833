"""tdreplay next to DeepMind Reverb: the same workloads, the same item layouts, one run, interleaved.

    make bench-peers                                 # builds .venv-peers, then the full run (~7 min)
    python bench/peers_bench.py --quick              # ~2 min: 2 rounds of 0.4 s per case
    python bench/peers_bench.py --json bench/results/peers.json   # what the README renders
    python bench/peers_bench.py --transports http    # tdreplay over HTTP only

Needs Reverb in its own environment (``dm-reverb==0.14.0``, its last release,
and TensorFlow 2.15 on Python 3.11): ``make bench-peers`` builds
``.venv-peers``; ``--peers-python`` points elsewhere. Without it the benchmark
says why and exits 0.

Four processes besides this driver: a tdreplay server (``python -m
tdreplay.service serve``, the shipped cartpole and atari schemas on the
default memmap backend, see ``common.schemas``), a Reverb server (tables of
the same fields, shapes, dtypes, capacity and selector kind, see
``reverb_peer.py``), and one client process for each
(``tdreplay_cases.py``: the public ``ReplayClient``, batches decoded into
TensorDicts; ``reverb_peer.py``: Reverb's Python client and tf.data).
Every case runs once per round, the cases compared with each other back to
back in a rotating order; a figure is the median over rounds, a ratio the
median of the per-round ratios (tdreplay / Reverb, higher is better for
tdreplay). Where Reverb has two ways (two writers), the faster of them in
each round is the baseline.

tdreplay runs each workload over HTTP (what a learner on another host
gets, as Reverb's gRPC) and over the same-host shared-memory transport
(what ``transport="auto"`` picks on one host); goals are judged on both.
Figures vary +-25% when other work shares the cores: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from common import (
    REPO,
    entry,
    failed,
    free_port,
    machine,
    print_entries,
    schemas,
    stop,
    wait_port,
    wait_up,
    write_json,
)
from workers import Worker, median_of, run_rounds

HERE = Path(__file__).resolve().parent
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"

#: (workload, tdreplay case, Reverb cases (the best one is the baseline), goal)
WORKLOADS: list[tuple[str, str, list[str], float | None]] = [
    ("cartpole sample b1, one call per batch", "cartpole sample b1", ["cartpole sample b1"], 1.0),
    ("cartpole b1, loader (prefetch 4)", "cartpole loader b1", ["cartpole stream b1"], None),
    ("cartpole b1, loader(stream=True)", "cartpole stream b1", ["cartpole stream b1"], 1.5),
    ("cartpole sample b32", "cartpole sample b32", ["cartpole dataset b32"], None),
    ("cartpole b32, loader", "cartpole loader b32", ["cartpole dataset b32"], 5.0),
    ("cartpole sample b256", "cartpole sample b256", ["cartpole dataset b256"], None),
    ("cartpole b256, loader", "cartpole loader b256", ["cartpole dataset b256"], None),
    ("atari sample b32", "atari sample b32", ["atari dataset b32"], None),
    ("atari sample b256", "atari sample b256", ["atari dataset b256"], 3.0),
    ("atari b256, loader", "atari loader b256", ["atari dataset b256"], None),
    ("cartpole writer(chunk=256)", "cartpole writer", ["cartpole trajectory_writer", "cartpole writer"], 3.0),
    ("atari writer(chunk=256)", "atari writer", ["atari trajectory_writer", "atari writer"], 1.5),
    ("cartpole extend b256", "cartpole extend b256", ["cartpole trajectory_writer", "cartpole writer"], None),
    ("atari extend b256", "atari extend b256", ["atari trajectory_writer", "atari writer"], None),
]  # fmt: skip

#: what Reverb's worker builds for each table
REVERB_CASES = {
    "cartpole": {"per_call": [1], "streams": [1], "datasets": [32, 256]},
    "atari": {"per_call": [], "streams": [], "datasets": [32, 256]},
}

#: cases run back to back, each round in a rotating order (tdreplay's for every transport)
GROUPS: list[tuple[list[str], list[str]]] = [
    (["cartpole sample b1", "cartpole loader b1", "cartpole stream b1"],
     ["cartpole sample b1", "cartpole stream b1"]),
    (["cartpole sample b32", "cartpole loader b32"], ["cartpole dataset b32"]),
    (["cartpole sample b256", "cartpole loader b256"], ["cartpole dataset b256"]),
    (["atari sample b32"], ["atari dataset b32"]),
    (["atari sample b256", "atari loader b256"], ["atari dataset b256"]),
    (["cartpole writer", "cartpole extend b256"], ["cartpole trajectory_writer", "cartpole writer"]),
    (["atari writer", "atari extend b256"], ["atari trajectory_writer", "atari writer"]),
]  # fmt: skip


def peers_problem(python: Path) -> str | None:
    """Why Reverb cannot run here, or None."""
    if not python.exists():
        return f"no Reverb environment at {python} (make bench-peers builds it)"
    probe = subprocess.run(
        [str(python), "-c", "import reverb, tensorflow"],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    if probe.returncode:
        return f"{python} cannot import reverb: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 rounds of 0.4 s per case")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.5, help="per case and round")
    p.add_argument("--transports", default="http,shm", help="tdreplay's, comma-separated")
    p.add_argument("--peers-python", type=Path, default=PEERS_PYTHON, help="Reverb's Python")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--strict", action="store_true", help="exit 1 when a goal fails")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 2, 0.4
    transports = [t for t in args.transports.split(",") if t]
    problem = peers_problem(args.peers_python)
    if problem:
        print(f"peers bench skipped: {problem}")
        return 0

    t_start = time.perf_counter()
    info = machine()
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    with (
        tempfile.TemporaryDirectory(prefix="tdreplay-peers-bench-") as tmp,
        open(Path(tmp) / "reverb.log", "w") as log,  # Reverb's C++ logs (writer warnings)
    ):
        work = Path(tmp)
        fields = schemas(work / "schemas")
        spec = {}
        for t, f in fields.items():
            shipped = yaml.safe_load((work / "schemas" / f"{t}.yaml").read_text())
            spec[t] = {
                "fields": f,
                "capacity": shipped["capacity"],
                "sampler": shipped["sampler"]["kind"],
                "alpha": shipped["sampler"].get("alpha", 0.6),
                **REVERB_CASES[t],
            }
        try:
            port, rport = free_port(), free_port()
            server = subprocess.Popen(
                [sys.executable, "-m", "tdreplay.service", "serve", "--schema", str(work / "schemas"),
                 "--root", str(work / "data"), "--port", str(port), "--log-level", "warning"],
            )  # fmt: skip
            procs.append(server)
            rserver = subprocess.Popen(
                [str(args.peers_python), str(HERE / "reverb_peer.py"), "serve", str(rport),
                 json.dumps(spec)],
                env=env, stdout=log, stderr=log,
            )  # fmt: skip
            procs.append(rserver)
            url = f"http://127.0.0.1:{port}"
            wait_up(f"{url}/readyz", server, "tdreplay server")
            wait_port(rport, rserver, "Reverb server")
            ours = Worker([sys.executable, str(HERE / "tdreplay_cases.py")])
            procs.append(ours.proc)
            theirs = Worker(
                [str(args.peers_python), str(HERE / "reverb_peer.py"), "worker"],
                env=env,
                stderr=log,
            )
            procs.append(theirs.proc)
            info["reverb"] = theirs.hello["versions"]
            print("filling the tables ...", file=sys.stderr, flush=True)
            ours.ask({"op": "setup", "url": url, "fields": fields, "transports": transports})
            theirs.ask({"op": "setup", "address": f"localhost:{rport}", "tables": spec})
            groups = [
                [f"tdreplay {tr}: {c}" for tr in transports for c in td]
                + [f"reverb: {c}" for c in rv]
                for td, rv in GROUPS
            ]
            print(
                f"# tdreplay vs Reverb ({'quick' if args.quick else 'full'}): {args.rounds} rounds "
                f"of {args.seconds:g} s per case; {info['cores']} cores, {info['cpu']}; "
                f"Reverb {info['reverb']}",
                flush=True,
            )
            runs = run_rounds(
                groups,
                lambda case: theirs if case.startswith("reverb:") else ours,
                args.rounds,
                args.seconds,
            )
        except Exception:
            log.flush()
            tail = (work / "reverb.log").read_text()[-3000:]
            print(f"Reverb's log (last 3000 characters):\n{tail}", file=sys.stderr)
            raise
        finally:
            stop(procs)
    info["loadavg_end"] = list(os.getloadavg())
    entries = report(runs, transports)
    wall = time.perf_counter() - t_start
    print(f"\n{wall:.0f}s")
    if args.json:
        write_json(
            args.json,
            "peers",
            entries,
            machine=info,
            quick=args.quick,
            rounds=args.rounds,
            seconds=args.seconds,
            runs=runs,
            wall_s=wall,
        )
    return 1 if args.strict and failed(entries) else 0


def report(runs: dict[str, list[dict]], transports: list[str]) -> list[dict[str, Any]]:
    entries = []
    for workload, td, rv, goal in WORKLOADS:
        base_runs = [runs[f"reverb: {c}"] for c in rv]
        # the faster Reverb case of each round
        best = [max(rs, key=lambda r: r["items_per_s"]) for rs in zip(*base_runs, strict=True)]
        names = {c: median_of(runs[f"reverb: {c}"]) for c in rv}
        base_name = "reverb " + max(names, key=lambda c: names[c]).split(" ", 1)[1]
        for tr in transports:
            ours = runs[f"tdreplay {tr}: {td}"]
            ratio = statistics.median(
                a["items_per_s"] / b["items_per_s"] for a, b in zip(ours, best, strict=True)
            )
            entries.append(
                entry(
                    "peers",
                    f"{workload} ({tr})",
                    median_of(ours),
                    "items/s",
                    base_name,
                    median_of(best),
                    ratio=ratio,
                    goal=goal,
                )
            )
    print_entries(entries)
    return entries


if __name__ == "__main__":
    sys.exit(main())
