"""What every benchmark shares: result entries, machine info, servers, ports and schemas
(worker processes and timed rounds are :mod:`workers`).

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

import contextlib
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
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
    """A free loopback port for a benchmark's server, in the benchmarks' slice below the
    kernel's ephemeral range, apart from the test suite's and Ray's worker ports
    (:mod:`tdreplay.system.ports`)."""
    from tdreplay.system import ports  # not at import time: the Reverb peer has no tdreplay

    return ports.free_port(ports.BENCH_PORTS)


def wait_up(url: str, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    """Poll ``url`` until it answers; raise if ``proc`` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except (OSError, http.client.HTTPException):  # not up, or not an HTTP server: not ours
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
