"""Polling a socket for an answer due soon, while it pays: :func:`poll`, the
:class:`Poller` both ends of the same-host socket use, and what tells whether the
machine has a CPU to spare (:func:`cpu_to_spare`, :func:`cpu_allowance`)."""

from __future__ import annotations

import contextlib
import math
import os
import socket  # noqa: F401  (the doctests')
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def poll(read: Callable[[], T], seconds: float) -> T | None:
    """Call ``read`` (a read of a non-blocking socket) again and again while it raises
    ``BlockingIOError``, for at most ``seconds``: its result, or ``None`` when nothing
    came in time.

    A thread that sleeps in the kernel until an answer comes leaves its CPU idle, and
    waking an idle CPU costs tens of microseconds on a virtual machine (measured here:
    ~35 µs a wake-up, two per round trip). Polling for an answer that comes soon keeps
    the CPU awake, for the CPU time the polling burns; both ends of the same-host
    socket poll through a :class:`Poller`, only while the other end answered within the
    window the last time. Between reads the thread yields its CPU
    (``sched_yield``) to any other thread that wants it.

        >>> a, b = socket.socketpair(); a.setblocking(False)
        >>> poll(lambda: a.recv(8), 0.0005) is None
        True
        >>> b.send(b"hi")
        2
        >>> poll(lambda: a.recv(8), 1.0)
        b'hi'
        >>> a.close(); b.close()
    """
    end = time.perf_counter() + seconds
    while True:
        try:
            return read()
        except BlockingIOError:
            if time.perf_counter() >= end:
                return None
            os.sched_yield()


#: the fewest CPUs a process needs to poll: polling holds one while it waits, and with
#: fewer than two the thread kept waiting is one of its own (or, under a CPU quota of less
#: than one, the process itself, throttled once the quota is spent)
POLL_CPUS = 2
#: seconds a reading of the CPUs this process may use is trusted
_ALLOWANCE_TTL = 1.0
#: [when read, CPUs]
_allowance: list[float] = [-math.inf, 0.0]


def cpu_allowance() -> float:
    """CPUs this process may use: those the calling thread's affinity allows, capped by
    its control group's CPU quota and its parents' (cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``: what ``docker run --cpus`` and
    Kubernetes' CPU limits set); read at most every second.

        >>> 0 < cpu_allowance() <= (os.cpu_count() or 1)
        True
    """
    now = time.monotonic()
    if now - _allowance[0] < _ALLOWANCE_TTL:
        return _allowance[1]
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        cpus = float(os.cpu_count() or 1)
    with contextlib.suppress(OSError, ValueError, IndexError):  # no control groups
        cpus = min(cpus, _cgroup_quota())
    _allowance[0], _allowance[1] = now, cpus
    return cpus


def _cgroup_quota() -> float:
    """The tightest CPU quota on this process's control group and its parents, in CPUs
    (``inf``: none)."""
    mounts: dict[str, tuple[str, Path]] = {}  # "v2" / "v1": (mount root, mount point)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        kind, options = fs.split()[0], fs.split()[2].split(",")
        root, point = fields.split()[3], Path(fields.split()[4])
        if kind == "cgroup2":
            mounts.setdefault("v2", (root, point))
        elif kind == "cgroup" and "cpu" in options:
            mounts.setdefault("v1", (root, point))
    best = math.inf
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        version = "v2" if controllers == "" else "v1" if "cpu" in controllers.split(",") else ""
        if version not in mounts:
            continue
        root, point = mounts[version]
        inside = path[len(root) :] if path.startswith(root) and root != "/" else path
        folder = point / inside.lstrip("/")
        while True:
            best = min(best, _quota(folder, version))
            if folder == point or point not in folder.parents:
                break
            folder = folder.parent
    return best


def _quota(folder: Path, version: str) -> float:
    """The CPU quota set on control group ``folder`` alone, in CPUs (``inf``: none)."""
    try:
        if version == "v2":
            quota, period = (folder / "cpu.max").read_text().split()
        else:
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return math.inf
    if quota in ("max", "-1") or int(period) <= 0:
        return math.inf
    return int(quota) / int(period)


#: seconds a reading of the runnable threads is trusted
_RUNNABLE_TTL = 0.01
#: [when read, whether a CPU was to spare, whether that reading had more threads than CPUs]
_runnable: list[float] = [-math.inf, 1.0, 0.0]


def cpu_to_spare() -> bool:
    """Whether the machine had no more runnable threads than CPUs, the caller included, a
    moment ago: ``False`` once two readings of ``/proc/loadavg`` in a row (read at most
    every 10 ms) counted more (one such reading is often a passing kernel thread);
    ``True`` where it is missing. Polling on a machine with no CPU to spare takes a CPU
    another thread needs. ``False`` too for a process allowed fewer than
    :data:`POLL_CPUS` CPUs (:func:`cpu_allowance`: a container's quota, an affinity)."""
    if cpu_allowance() < POLL_CPUS:
        return False
    now = time.perf_counter()
    if now - _runnable[0] < _RUNNABLE_TTL:
        return bool(_runnable[1])
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        over = running > (os.cpu_count() or 1)
    except (OSError, ValueError, IndexError):
        over = False
    spare = not (over and _runnable[2])
    _runnable[0], _runnable[1], _runnable[2] = now, spare, over
    return spare


#: seconds a poll may spend off its CPU before that counts as losing it (a passing
#: interrupt or kernel thread takes tens of microseconds; a busy thread beside the poller
#: takes milliseconds)
LOST_CPU = 0.0005
#: seconds a :class:`Poller` pauses after a poll that did not pay (doubled for each more
#: in a row)
FIRST_PAUSE = 0.001


class Poller:
    """:func:`poll` for up to ``seconds`` while polling pays: when the other end's last
    answer (or request) came within ``seconds``, and not for a while after a poll that did
    not pay: one that found nothing in time, or during which the thread lost its CPU for
    half the time or more, and :data:`LOST_CPU` at least (the machine has more runnable
    threads than CPUs: a thread polling then holds a CPU the answer needs; measured here
    with one busy process beside a client and server, polling made one-item calls 2.5x
    slower).

    The pause doubles with each such poll in a row, from :data:`FIRST_PAUSE` up to
    ``pause`` seconds, and a poll that pays ends the run: one passing interrupt costs a
    millisecond of polling, not ``pause`` (a tight loop of one-item calls makes ten in a
    millisecond and hundreds in 50), while a busy machine is polled a few times a second.

        >>> a, b = socket.socketpair(); a.setblocking(False)
        >>> poller = Poller(0.0005, spare=lambda: True)
        >>> poller.ready(), poller.read(lambda: a.recv(8)), poller.ready()
        (True, None, False)
        >>> a.close(); b.close()
    """

    def __init__(
        self, seconds: float, pause: float = 0.05, spare: Callable[[], bool] = cpu_to_spare
    ) -> None:
        self.seconds = seconds
        self.pause = pause
        self.spare = spare  # whether the machine has a CPU to spare (:func:`cpu_to_spare`)
        self.resume = 0.0  # time.perf_counter() from which polling is tried again
        self.unpaid = 0  # polls in a row that did not pay
        self.polls = 0  # polls so far

    def ready(self, waited: float = 0.0) -> bool:
        """Whether polling is worth trying now, the other end's last answer having taken
        ``waited`` seconds to come (the machine must have a CPU to spare, too)."""
        return waited < self.seconds and time.perf_counter() >= self.resume and self.spare()

    def read(self, read: Callable[[], T], most: float = math.inf) -> T | None:
        """:func:`poll` ``read`` for up to ``seconds`` (``most``, if less: a poll cut short
        that finds nothing is no sign polling does not pay): its result, or ``None``."""
        self.polls += 1
        began, cpu = time.perf_counter(), time.thread_time()
        got = poll(read, min(self.seconds, most))
        now = time.perf_counter()
        missed = got is None and most >= self.seconds
        lost = (now - began) - (time.thread_time() - cpu)  # off its CPU meanwhile
        if missed or (lost > LOST_CPU and lost > (now - began) / 2):
            self.unpaid += 1
            self.resume = now + min(self.pause, FIRST_PAUSE * 2 ** min(self.unpaid - 1, 32))
        elif got is not None:
            self.unpaid = 0
        return got
