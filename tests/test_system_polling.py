"""Polling needs CPUs of its own: a process allowed fewer than two (an affinity, a
container's CPU quota, read from real control groups) never polls
(:func:`tdreplay.system.cpu_allowance`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tdreplay.system.polling import POLL_CPUS

#: what a process reports of itself
REPORT = (
    "import json; from tdreplay.system import Poller, cpu_allowance, cpu_to_spare; "
    "print(json.dumps([cpu_allowance(), cpu_to_spare(), Poller(0.001).ready()]))"
)


def report(preexec: object = None) -> list[object]:
    done = subprocess.run(
        [sys.executable, "-c", REPORT], capture_output=True, text=True, check=True,
        preexec_fn=preexec,  # type: ignore[arg-type]
    )  # fmt: skip
    return list(json.loads(done.stdout))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < POLL_CPUS, reason="needs two CPUs")
def test_a_process_pinned_to_one_cpu_does_not_poll() -> None:
    cpu = min(os.sched_getaffinity(0))
    assert report(lambda: os.sched_setaffinity(0, {cpu})) == [1.0, False, False]
    allowed, _, _ = report()
    assert allowed == len(os.sched_getaffinity(0))


def _cpu_hierarchy() -> tuple[str, Path] | None:
    """A control-group hierarchy with the cpu controller that this process may write to."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        kind, point = fs.split()[0], Path(fields.split()[4])
        if kind == "cgroup" and "cpu" in fs.split()[2].split(",") and os.access(point, os.W_OK):
            return "v1", point
        if kind == "cgroup2" and os.access(point, os.W_OK):
            with contextlib.suppress(OSError):
                if "cpu" in (point / "cgroup.subtree_control").read_text().split():
                    return "v2", point
    return None


@contextlib.contextmanager
def cgroup(version: str, parent: Path, quota: float | None) -> Iterator[Path]:
    """A new control group under ``parent`` with a CPU quota of ``quota`` CPUs (``None``:
    none), removed afterwards."""
    folder = parent / f"tdreplay-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    try:
        if quota is not None:
            if version == "v2":
                (folder / "cpu.max").write_text(f"{int(quota * 100_000)} 100000")
            else:
                (folder / "cpu.cfs_period_us").write_text("100000")
                (folder / "cpu.cfs_quota_us").write_text(str(int(quota * 100_000)))
        if version == "v2" and quota is not None:
            (folder / "cgroup.subtree_control").write_text("+cpu")
        yield folder
    finally:
        folder.rmdir()


def test_a_container_cpu_quota_under_two_cpus_stops_polling() -> None:
    """A quota of 1.5 CPUs on a process's control group's parent (its own has none) is
    what it may use, and stops its polling; a quota of 8 CPUs leaves its affinity."""
    found = _cpu_hierarchy()
    if found is None:
        pytest.skip("no writable control-group hierarchy with the cpu controller")
    version, root = found
    with cgroup(version, root, 1.5) as outer, cgroup(version, outer, None) as inner:

        def join() -> None:
            (inner / "cgroup.procs").write_text(str(os.getpid()))

        assert report(join) == [1.5, False, False]
    with cgroup(version, root, 8) as loose:
        allowed, _, _ = report(lambda: (loose / "cgroup.procs").write_text(str(os.getpid())))
        assert allowed == len(os.sched_getaffinity(0))
