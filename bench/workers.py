"""Worker processes and timed rounds: how a benchmark runs its cases.

A benchmark's client side runs in processes of its own (``serve_worker`` on
stdin/stdout, driven by a ``Worker``); the cases compared with each other run
back to back, round after round in a rotating order (``run_rounds``), and a
ratio is the median of per-round ratios (``paired_ratio``).
``one_server_main`` is the whole command line of a one-server, one-client
benchmark. Like :mod:`common`, this module imports only the standard library
(the Reverb peer runs it without torch).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import MARK, free_port, machine, print_entries, schemas, stop, wait_up, write_json


class Case:
    """A timed workload in a worker: ``call()`` moves ``items`` items; ``finish`` ends a run.

    ``finish`` (a writer's flush) runs inside the timed window, once, after the
    last call.
    """

    def __init__(
        self, call: Callable[[], Any], items: int, finish: Callable[[], Any] | None = None
    ) -> None:
        self.call, self.items, self.finish = call, items, finish


def timed_run(case: Case, seconds: float, start: float | None = None) -> dict[str, float]:
    """Call ``case`` for about ``seconds`` (after one untimed call); calls, items, wall, CPU, p50."""
    case.call()
    if case.finish is not None:
        case.finish()
    if start is not None:
        time.sleep(max(0.0, start - time.monotonic()))
    lat: list[float] = []
    c0, t0 = time.process_time(), time.perf_counter()
    end, last = t0 + seconds, t0
    while True:
        case.call()
        now = time.perf_counter()
        lat.append(now - last)
        last = now
        if now >= end:
            break
    if case.finish is not None:
        case.finish()
        now = time.perf_counter()
    wall = now - t0
    return {
        "calls": len(lat),
        "items_per_s": len(lat) * case.items / wall,
        "wall": wall,
        "cpu": time.process_time() - c0,
        "p50_ms": statistics.median(lat) * 1e3,
    }


def serve_worker(make_cases: Callable[[dict[str, Any]], dict[str, Case]], hello: dict) -> None:
    """A worker's loop: JSON commands on stdin, ``MARK``-ed JSON answers on stdout.

    Commands: ``{"op": "setup", ...}`` (passed to ``make_cases``, which fills
    tables and returns the cases), ``{"op": "run", "case", "seconds"}``.
    An exception is answered as ``{"error": ...}`` and the worker goes on.
    """

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(MARK + json.dumps(obj) + "\n")
        sys.stdout.flush()

    reply({"ready": True, **hello})
    cases: dict[str, Case] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "setup":
                cases = make_cases(cmd)
                reply({"cases": sorted(cases)})
            elif cmd["op"] == "run":
                reply(timed_run(cases[cmd["case"]], cmd["seconds"], cmd.get("start")))
        except Exception as exc:  # reported to the driver, which names the case
            reply({"error": f"{type(exc).__name__}: {exc}"})


class Worker:
    """A worker process driven over its stdin/stdout (``serve_worker`` on the other end)."""

    def __init__(
        self, cmd: list[str], env: dict[str, str] | None = None, stderr: Any = None
    ) -> None:
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
            bufsize=1, env=env,
        )  # fmt: skip
        self.hello = self.read(600)

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 600.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise RuntimeError(f"worker {self.proc.pid} did not answer in {timeout:.0f}s")
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {self.proc.pid} exited with {self.proc.wait()}")
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
            sys.stdout.write(line)  # anything else a library printed

    def ask(self, cmd: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
        self.send(cmd)
        got = self.read(timeout)
        if "error" in got:
            raise RuntimeError(f"worker {self.proc.pid}, {cmd}: {got['error']}")
        return got


def paired_ratio(runs: list[dict], base: list[dict], key: str = "items_per_s") -> float:
    """Median over rounds of this round's value / the baseline's in the same round."""
    return statistics.median(a[key] / b[key] for a, b in zip(runs, base, strict=True))


def rotate(items: list[Any], r: int) -> list[Any]:
    """``items`` starting at position ``r`` (mod its length): each round a new first case."""
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def run_rounds(
    groups: list[list[str]],
    worker_of: Callable[[str], Worker],
    rounds: int,
    seconds: float,
) -> dict[str, list[dict[str, float]]]:
    """Every case of every group once per round, each group's cases in a rotating order.

    Cases compared with each other share a group, so they run back to back and
    a burst of load from elsewhere lands on all of them alike; ratios are then
    taken within a round (``paired_ratio``).
    """
    runs: dict[str, list[dict[str, float]]] = {}
    for r in range(rounds):
        for group in groups:
            for case in rotate(group, r):
                got = worker_of(case).ask({"op": "run", "case": case, "seconds": seconds})
                runs.setdefault(case, []).append(got)
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return runs


def median_of(runs: list[dict[str, float]], key: str = "items_per_s") -> float:
    return statistics.median(run[key] for run in runs)


def one_server_rounds(
    script: Path,
    setup: dict[str, Any],
    groups: list[list[str]],
    args: Any,
    title: str,
) -> tuple[dict[str, list[dict[str, float]]], dict[str, Any]]:
    """The rounds of a one-server, one-client benchmark: a server on the shipped schemas
    (``python -m tdreplay.service serve``, one torch thread, memmap, a temporary root) and
    ``script --worker`` as the client process, set up with the server's ``url``, the tables'
    ``fields`` and ``setup``; every group of ``groups`` run ``args.rounds`` times for
    ``args.seconds`` per case (``run_rounds``). Returns the runs and the machine's figures
    (load average at the start and at the end)."""
    info = machine()
    info["loadavg_start"] = info.pop("loadavg")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="tdreplay-bench-") as tmp:
        work = Path(tmp)
        fields = schemas(work / "schemas")
        try:
            port = free_port()
            server = subprocess.Popen(
                [sys.executable, "-m", "tdreplay.service", "serve", "--schema", str(work / "schemas"),
                 "--root", str(work / "data"), "--port", str(port), "--torch-threads", "1",
                 "--log-level", "warning"],
            )  # fmt: skip
            procs.append(server)
            url = f"http://127.0.0.1:{port}"
            wait_up(f"{url}/readyz", server, "tdreplay server")
            worker = Worker([sys.executable, str(script), "--worker"])
            procs.append(worker.proc)
            worker.ask({"op": "setup", "url": url, "fields": fields, **setup})
            print(
                f"# {title} ({'quick' if args.quick else 'full'}): {args.rounds} rounds of "
                f"{args.seconds:g} s per case; {info['cores']} cores, {info['cpu']}",
                flush=True,
            )
            runs = run_rounds(groups, lambda _case: worker, args.rounds, args.seconds)
        finally:
            stop(procs)
    info["loadavg_end"] = list(os.getloadavg())
    return runs, info


def one_server_main(
    argv: list[str] | None,
    doc: str | None,
    name: str,
    script: Path,
    make_cases: Callable[[dict[str, Any]], dict[str, Case]],
    groups: Callable[[list[str]], list[list[str]]],
    entries: Callable[[dict[str, list[dict[str, float]]], list[str]], list[dict[str, Any]]],
) -> int:
    """The command line of a one-server, one-client benchmark (``script``): ``--quick``,
    ``--rounds``, ``--seconds``, ``--transports``, ``--json``; the worker side when started
    with ``--worker``. ``groups(transports)`` names the cases run back to back,
    ``entries(runs, transports)`` makes the figures; they are printed, and written as JSON."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 rounds of 0.5 s per case")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.5, help="per case and round")
    p.add_argument("--transports", default="http,shm", help="comma-separated")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        serve_worker(make_cases, {"side": name})
        return 0
    if args.quick:
        args.rounds, args.seconds = 2, 0.5
    transports = [t for t in args.transports.split(",") if t]
    t_start = time.perf_counter()
    runs, info = one_server_rounds(
        script, {"transports": transports}, groups(transports), args, f"tdreplay {name} bench"
    )
    figures = entries(runs, transports)
    print_entries(figures)
    wall = time.perf_counter() - t_start
    print(f"\n{wall:.0f}s")
    if args.json:
        write_json(
            args.json,
            name,
            figures,
            machine=info,
            quick=args.quick,
            rounds=args.rounds,
            seconds=args.seconds,
            runs=runs,
            wall_s=wall,
        )
    return 0
