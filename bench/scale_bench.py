"""Scale out on one host: K collector and L learner processes against S tdreplay servers.

    python bench/scale_bench.py                  # full run (~3 min): 5 rounds of 3 s per configuration
    python bench/scale_bench.py --quick          # ~1 min: 2 rounds of 1 s
    python bench/scale_bench.py --json bench/results/scale.json   # what the README renders
    python bench/scale_bench.py --configs 1x2x1:http,4x2x1:http   # S x K x L : transport

Starts S servers (``python -m tdreplay.service serve``, each its own process
and data root in a temporary folder, one torch thread, the default memmap
backend) holding a ``cartpole`` table: the shipped schema's 11 fields,
sampler and writer, a capacity of 65,536 and no rate limiter beyond
``min_size_to_sample: 1`` (inserts are never held back). Each server is
filled with 8,192 rows first. Then, per configuration, started together:

* K collectors, each ``client.extend("cartpole", rows)`` of 256-row chunks in a
  loop (a sharded client sends each chunk to the next server in turn);
* L learners, each ``client.sample("cartpole", 256)``, one call per batch (a
  sharded client splits the batch across the servers by their sizes).

Every client is ``ReplayClient(urls, transport=...)`` over the first S servers,
one torch thread per process. Reported per configuration: the aggregate
insert and sample rates (items/s summed over the processes), and the CPU
seconds per second of every server (``/proc/<pid>/stat``), of the collectors
and of the learners (``time.process_time`` in each), and the items a server
moves per CPU-second of its own. The baseline of an S-server configuration
is the 1-server configuration with the same K and L and transport, measured
in the same run: every configuration runs once per round, in a rotating
order, and a ratio is the median of the per-round ratios.

Honest about the machine: all S + K + L processes share this host's cores.
On a 2-core machine more servers add no CPU, only processes competing for it,
so the ratios say what sharding costs or gains on the same cores, not what S
hosts would do; the CPU split says where the cycles went, and "items per
server CPU-second" is what the capacity model in the README multiplies by S.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    REPO,
    cpu_seconds,
    entry,
    free_port,
    machine,
    print_entries,
    stop,
    wait_up,
    write_json,
)
from workers import Case, Worker, rotate, serve_worker

HERE = Path(__file__).resolve().parent
TABLE = "cartpole"
CAPACITY = 65_536
FILL = 8192  # rows per server before the first round
CHUNK = 256  # rows per extend
BATCH = 256  # items per sample
DEFAULT_CONFIGS = "1x2x1:http,2x2x1:http,1x3x2:http,3x3x2:http,1x2x1:shm,2x2x1:shm"

Config = tuple[int, int, int, str]  # servers, collectors, learners, transport


def parse_configs(text: str) -> list[Config]:
    """``"1x2x1:http,2x2x1:shm"`` as ``[(1, 2, 1, "http"), (2, 2, 1, "shm")]``."""
    out = []
    for item in text.split(","):
        sizes, _, transport = item.partition(":")
        s, k, n = (int(x) for x in sizes.split("x"))
        if transport not in ("http", "shm") or min(s, k, n) < 1:
            raise ValueError(f"bad configuration {item!r}: want SxKxL:http or SxKxL:shm")
        out.append((s, k, n, transport))
    return out


def label(c: Config) -> str:
    return f"S={c[0]} K={c[1]} L={c[2]} ({c[3]})"


def baseline_of(c: Config) -> Config:
    return (1, c[1], c[2], c[3])


# ------------------------------------------------------------------ worker side
def make_cases(cfg: dict[str, Any]) -> dict[str, Case]:
    """A collector's or learner's cases: one per (servers, transport), named ``"S transport"``."""
    import torch
    from tdreplay_cases import rows

    from tdreplay.client import ReplayClient

    torch.set_num_threads(1)
    fields = {k: (s, d) for k, (s, d) in cfg["fields"].items()}
    urls = cfg["urls"]
    if cfg.get("fill"):
        for url in urls:
            with ReplayClient(url, transport="http") as one:
                for i in range(0, FILL, CHUNK):
                    one.extend(TABLE, rows(fields, CHUNK, seed=100 + i))
    chunk = rows(fields, CHUNK, seed=cfg["index"])
    cases: dict[str, Case] = {}
    for s, transport in cfg["shards"]:
        client = ReplayClient(urls[:s], transport=transport, timeout=120)
        if client.transport != transport:
            raise RuntimeError(f"asked for transport {transport!r}, got {client.transport!r}")
        if cfg["role"] == "collector":
            case = Case(lambda c=client: c.extend(TABLE, chunk), CHUNK)
        else:
            case = Case(lambda c=client: c.sample(TABLE, BATCH), BATCH)
        for _ in range(3):  # connections, shm slots, the clients' size views
            case.call()
        cases[f"{s} {transport}"] = case
    return cases


# ------------------------------------------------------------------ main side
def write_schema(into: Path) -> dict[str, tuple[list[int], str]]:
    """The shipped cartpole schema, small and with no ratio limiter; returns its fields."""
    import yaml

    spec = yaml.safe_load((REPO / "schemas" / f"{TABLE}.yaml").read_text())
    spec["capacity"] = CAPACITY
    spec["rate_limiter"] = {"min_size_to_sample": 1}
    into.mkdir(parents=True, exist_ok=True)
    (into / f"{TABLE}.yaml").write_text(yaml.safe_dump(spec))
    return {k: (v["shape"], v["dtype"]) for k, v in spec["fields"].items()}


def measure(
    config: Config,
    collectors: list[Worker],
    learners: list[Worker],
    servers: list[int],
    seconds: float,
) -> dict[str, Any]:
    """One timed run of ``config``: its K collectors and L learners started together."""
    s, k, n, transport = config
    procs = collectors[:k] + learners[:n]
    start = time.monotonic() + 0.5  # after every process's untimed first call
    for w in procs:
        w.send({"op": "run", "case": f"{s} {transport}", "seconds": seconds, "start": start})
    time.sleep(max(0.0, start - time.monotonic()))
    s0 = [cpu_seconds(pid) for pid in servers[:s]]
    got = [w.read() for w in procs]
    s1, wall = [cpu_seconds(pid) for pid in servers[:s]], time.monotonic() - start
    for g in got:
        if "error" in g:
            raise RuntimeError(f"{label(config)}: {g['error']}")
    col, lrn = got[:k], got[k:]
    return {
        "insert": sum(g["items_per_s"] for g in col),
        "sample": sum(g["items_per_s"] for g in lrn),
        "server_cpu": [(b - a) / wall for a, b in zip(s0, s1, strict=True)],
        "collector_cpu": [g["cpu"] / g["wall"] for g in col],
        "learner_cpu": [g["cpu"] / g["wall"] for g in lrn],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 rounds of 1 s per configuration")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=3.0, help="per configuration and round")
    p.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"S x K x L : transport (default {DEFAULT_CONFIGS})",
    )
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        serve_worker(make_cases, {"side": "scale"})
        return 0
    if args.quick:
        args.rounds, args.seconds = 2, 1.0
    configs = parse_configs(args.configs)
    for c in configs:
        if c[0] > 1 and baseline_of(c) not in configs:
            configs.append(baseline_of(c))  # every ratio's baseline runs in the same rounds
    n_servers = max(c[0] for c in configs)
    n_col, n_lrn = max(c[1] for c in configs), max(c[2] for c in configs)

    t_start = time.perf_counter()
    info = machine()
    info["loadavg_start"] = info.pop("loadavg")
    procs: list[subprocess.Popen] = []
    runs: dict[Config, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="tdreplay-scale-bench-") as tmp:
        work = Path(tmp)
        fields = write_schema(work / "schemas")
        try:
            servers, urls = [], []
            for i in range(n_servers):
                port = free_port()
                server = subprocess.Popen(
                    [sys.executable, "-m", "tdreplay.service", "serve",
                     "--schema", str(work / "schemas"), "--root", str(work / f"server{i}"),
                     "--port", str(port), "--torch-threads", "1", "--log-level", "warning"],
                )  # fmt: skip
                procs.append(server)
                servers.append(server)
                urls.append(f"http://127.0.0.1:{port}")
            for url, server in zip(urls, servers, strict=True):
                wait_up(f"{url}/readyz", server, f"tdreplay server {url}")
            print(f"filling {n_servers} servers ...", file=sys.stderr, flush=True)
            shards = sorted({(c[0], c[3]) for c in configs})
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker"]
            collectors, learners = [], []
            for i in range(n_col + n_lrn):
                w = Worker(cmd)
                procs.append(w.proc)
                (collectors if i < n_col else learners).append(w)
            # collectors set up in parallel (the first fills every server), then the learners,
            # whose warm-up samples need rows
            for group in (collectors, learners):
                for w in group:
                    i = (collectors + learners).index(w)
                    w.send({
                        "op": "setup", "urls": urls, "fields": fields, "shards": shards,
                        "index": i, "role": "collector" if i < n_col else "learner",
                        "fill": i == 0,
                    })  # fmt: skip
                for w in group:
                    got = w.read()
                    if "error" in got:
                        raise RuntimeError(f"worker {w.proc.pid} setup: {got['error']}")
            print(
                f"# tdreplay scale bench ({'quick' if args.quick else 'full'}): {args.rounds} "
                f"rounds of {args.seconds:g} s per configuration; {info['cores']} cores, "
                f"{info['cpu']}\n# {n_servers} servers, {n_col} collector and {n_lrn} learner "
                f"processes; {TABLE} extend b{CHUNK} / sample b{BATCH}",
                flush=True,
            )
            pids = [s.pid for s in servers]
            for r in range(args.rounds):
                for c in rotate(configs, r):
                    got = measure(c, collectors, learners, pids, args.seconds)
                    runs.setdefault(c, []).append(got)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            stop(procs)
    info["loadavg_end"] = list(os.getloadavg())
    wall = time.perf_counter() - t_start
    entries, summary = report(configs, runs)
    print(f"\n{wall:.0f}s")
    if args.json:
        write_json(
            args.json,
            "scale",
            entries,
            machine=info,
            quick=args.quick,
            rounds=args.rounds,
            seconds=args.seconds,
            table=TABLE,
            chunk=CHUNK,
            batch=BATCH,
            configs=summary,
            runs={label(c): r for c, r in runs.items()},
            wall_s=wall,
        )
    return 0


def report(
    configs: list[Config], runs: dict[Config, list[dict[str, Any]]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Entries (rates and CPU, S servers / 1 server) and one summary row per configuration."""

    def med(c: Config, key: str) -> float:
        return statistics.median(
            sum(r[key]) if isinstance(r[key], list) else r[key] for r in runs[c]
        )

    def per_server_cpu_s(r: dict[str, Any]) -> float:
        """Items (inserted + sampled) per CPU-second of the servers."""
        return (r["insert"] + r["sample"]) / sum(r["server_cpu"])

    summary = []
    print(
        f"\n{'configuration':<22} {'insert/s':>9} {'sample/s':>9} {'x1 ins':>6} {'x1 smp':>6}  "
        f"{'servers CPU (each)':<24} {'coll CPU':>8} {'lrn CPU':>8} {'items/srv CPU-s':>15}"
    )
    for c in sorted(configs, key=lambda c: (c[3], c[1], c[2], c[0])):
        rs, base = runs[c], runs[baseline_of(c)]
        row = {
            "servers": c[0], "collectors": c[1], "learners": c[2], "transport": c[3],
            "insert": med(c, "insert"), "sample": med(c, "sample"),
            "insert_ratio": statistics.median(a["insert"] / b["insert"] for a, b in zip(rs, base, strict=True)),
            "sample_ratio": statistics.median(a["sample"] / b["sample"] for a, b in zip(rs, base, strict=True)),
            "server_cpu": med(c, "server_cpu"),
            "server_cpu_each": [statistics.median(r["server_cpu"][i] for r in rs) for i in range(c[0])],
            "collector_cpu": med(c, "collector_cpu"),
            "learner_cpu": med(c, "learner_cpu"),
            "items_per_server_cpu_s": statistics.median(per_server_cpu_s(r) for r in rs),
        }  # fmt: skip
        summary.append(row)
        each = "+".join(f"{x:.2f}" for x in row["server_cpu_each"])
        print(
            f"{label(c):<22} {row['insert']:>9,.0f} {row['sample']:>9,.0f} "
            f"{row['insert_ratio']:>6.2f} {row['sample_ratio']:>6.2f}  "
            f"{row['server_cpu']:.2f} ({each}){'':<{max(0, 16 - len(each))}} "
            f"{row['collector_cpu']:>8.2f} {row['learner_cpu']:>8.2f} "
            f"{row['items_per_server_cpu_s']:>15,.0f}"
        )
    print("(CPU: CPU seconds per second, summed over the processes of each kind)")

    entries = []
    for row in summary:
        c: Config = (row["servers"], row["collectors"], row["learners"], row["transport"])
        base = None if c[0] == 1 else label(baseline_of(c))
        b = next(
            x
            for x in summary
            if (x["servers"], x["collectors"], x["learners"], x["transport"]) == baseline_of(c)
        )
        for what, key, unit in (
            ("insert", "insert", "items/s"),
            ("sample", "sample", "items/s"),
            ("servers' CPU", "server_cpu", "CPU s/s"),
            ("collectors' CPU", "collector_cpu", "CPU s/s"),
            ("learners' CPU", "learner_cpu", "CPU s/s"),
            ("items per server CPU-second", "items_per_server_cpu_s", "items/CPU-s"),
        ):
            ratio = row.get(f"{key}_ratio") if base else None
            entries.append(
                entry(
                    "scale",
                    f"{TABLE} {label(c)}: {what}",
                    row[key],
                    unit,
                    base,
                    b[key] if base else None,
                    ratio=ratio,
                )
            )  # fmt: skip
    print_entries(entries)
    return entries, summary


if __name__ == "__main__":
    sys.exit(main())
