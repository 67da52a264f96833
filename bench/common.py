"""What every benchmark shares: result entries, machine info, worker processes, timing.

Every ``*_bench.py`` reports its figures as a list of entries, one per
figure, with the same keys (``bench/run.py --json FILE`` collects them)::

    {"bench": "http", "workload": "cartpole sample b32 (http)", "value": 41000.0,
     "unit": "items/s", "baseline": "raw HTTP, same bytes", "baseline_value": 90000.0,
     "ratio": 0.46, "goal": null, "pass": null}

``ratio`` is value / baseline_value unless the benchmark says otherwise (a
median of per-round ratios, or a lower-is-better figure turned round);
``goal`` is the ratio a goal asks for (``ratio >= goal`` passes), ``None``
where a figure is only reported. A goal on the figure itself (at least
10,000 items/s, at most 2 ms) has the bound as its baseline, named
``"goal: at least"`` / ``"goal: at most"``, and ``goal`` 1 (``bound_entry``).

This module imports only the standard library at import time: the Reverb
peer (``bench/reverb_peer.py``) runs it in an environment without torch.
Not named ``*_bench.py``: ``bench/run.py`` runs every file that is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MARK = "@@ "  # a worker's protocol lines on stdout start with this


# ------------------------------------------------------------------ entries
def entry(
    bench: str,
    workload: str,
    value: float,
    unit: str,
    baseline: str | None = None,
    baseline_value: float | None = None,
    *,
    ratio: float | None = None,
    goal: float | None = None,
) -> dict[str, Any]:
    """One figure; ``ratio`` defaults to value / baseline_value, ``pass`` is ratio >= goal."""
    if ratio is None and baseline_value:
        ratio = value / baseline_value
    ok = None if goal is None or ratio is None else bool(ratio >= goal)
    return {
        "bench": bench,
        "workload": workload,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_value": baseline_value,
        "ratio": ratio,
        "goal": goal,
        "pass": ok,
    }


def bound_entry(
    bench: str, workload: str, value: float, unit: str, bound: float, *, most: bool = False
) -> dict[str, Any]:
    """A goal stated as a bound on the figure itself (``value >= bound``, or ``<= bound``).

    The baseline is the bound; ``ratio`` is value / bound (bound / value for an
    upper bound), so that here too the goal is ``ratio >= 1``.
    """
    ratio = (bound / value if value else float("inf")) if most else value / bound
    return entry(
        bench,
        workload,
        value,
        unit,
        f"goal: {'at most' if most else 'at least'}",
        bound,
        ratio=ratio,
        goal=1.0,
    )


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def print_entries(entries: list[dict[str, Any]]) -> None:
    """The entries as a table, then each goal as PASS / FAIL."""
    width = max([len(e["workload"]) for e in entries] + [8])
    print(f"\n{'workload':<{width}}  {'value':>18}  {'baseline':<26} {'its value':>18}  ratio")
    for e in entries:
        ratio = "" if e["ratio"] is None else f"{e['ratio']:.2f}x"
        print(
            f"{e['workload']:<{width}}  {fmt(e['value'], e['unit']):>18}  "
            f"{e['baseline'] or '':<26} {fmt(e['baseline_value'], e['unit']):>18}  {ratio}"
        )
    goals = [e for e in entries if e["goal"] is not None]
    if goals:
        print("\ngoals:")
        for e in goals:
            mark = "PASS" if e["pass"] else "FAIL"
            if str(e["baseline"]).startswith("goal: "):
                what = f"{fmt(e['value'], e['unit'])}, {e['baseline'][6:]} {fmt(e['baseline_value'], e['unit'])}"
            else:
                what = f"{e['ratio']:.2f}x {e['baseline']} (goal >= {e['goal']:g}x)"
            print(f"  {mark}  {e['workload']}: {what}")
        print(f"{sum(bool(e['pass']) for e in goals)}/{len(goals)} goals met")


def write_json(path: Path, bench: str, entries: list[dict[str, Any]], **extra: Any) -> None:
    """``{"bench", "command", "machine", "entries", ...extra}`` to ``path``."""
    out = {
        "bench": bench,
        "command": " ".join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
        "machine": extra.pop("machine", None) or machine(),
        "entries": entries,
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


def failed(entries: Iterable[dict[str, Any]]) -> bool:
    return any(e["pass"] is False for e in entries)


# ------------------------------------------------------------------ machine
def machine() -> dict[str, Any]:
    """Cores, CPU, memory, versions and load of this machine (for every JSON)."""
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg": list(os.getloadavg()),
    }
    with contextlib.suppress(OSError, IndexError, ValueError):
        kib = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1]
        info["mem_gib"] = round(int(kib) / 2**20, 1)
    for name in ("torch", "tensordict", "torchrl"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    return info


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads, from ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    after_comm = stat[stat.rindex(")") + 2 :].split()  # fields 3.. (comm may hold spaces)
    return (int(after_comm[11]) + int(after_comm[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    """Poll ``url`` until it answers; raise if ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)  # readiness poll
    raise RuntimeError(f"{what} did not come up in {timeout:.0f}s")


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    """Wait until something accepts TCP connections on ``port`` (a gRPC server)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)  # readiness poll
    raise RuntimeError(f"{what} did not come up in {timeout:.0f}s")


def schemas(into: Path) -> dict[str, dict[str, tuple[list[int], str]]]:
    """The shipped cartpole and atari schemas as the benchmarks run them; returns their fields.

    Fields, samplers and backend (memmap) as shipped. The atari schema's rate
    limiter (samples_per_insert 8) would hold a benchmark's inserts back: it
    runs with ``min_size_to_sample: 1`` and no ratio, and a capacity of 4096.
    """
    import yaml

    into.mkdir(parents=True, exist_ok=True)
    fields = {}
    for name in ("cartpole", "atari"):
        spec = yaml.safe_load((REPO / "schemas" / f"{name}.yaml").read_text())
        if name == "atari":
            spec["capacity"] = 4096
            spec["rate_limiter"] = {"min_size_to_sample": 1}
        (into / f"{name}.yaml").write_text(yaml.safe_dump(spec))
        fields[name] = {k: (v["shape"], v["dtype"]) for k, v in spec["fields"].items()}
    return fields


def stop(procs: list[subprocess.Popen]) -> None:
    """End the processes this benchmark started: workers by closing stdin, servers by SIGTERM."""
    for proc in procs[::-1]:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        else:
            proc.terminate()
    for proc in procs[::-1]:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


# ------------------------------------------------------------------ workers
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
