"""What waking an idle CPU costs on this machine: two bare processes on a socket pair.

Per round trip, 50 us of work on one side and 40 on the other, both sleeping in
``recv`` for the other's message or both polling for it (``tdreplay.system.poll``,
what the same-host transport does for a client calling in a tight loop; see
``--shm-poll-us``). :mod:`shm_bench` reports it beside its figures.
"""

from __future__ import annotations

import os
import socket
import time

from tdreplay.system import poll


def _busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _recv(s: socket.socket, polling: bool) -> bytes:
    got = poll(lambda: s.recv(64, socket.MSG_DONTWAIT), 0.0002) if polling else None
    return got if got is not None else s.recv(64)


def round_trips(polling: bool, seconds: float) -> float:
    """Round trips per second of two bare processes (a forked echo), 50 us of work on its
    side and 40 on this one per round trip, both sleeping or both polling for the other."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echo
        a.close()
        while _recv(b, polling):
            _busy(50)
            b.send(b"x" * 32)
        os._exit(0)
    b.close()
    try:
        n, t0 = 0, time.perf_counter()
        while (now := time.perf_counter()) - t0 < seconds:
            a.send(b"q")
            _recv(a, polling)
            _busy(40)
            n += 1
        return n / (now - t0)
    finally:
        a.close()
        os.waitpid(pid, 0)


def wake_cost(rounds: int, seconds: float) -> dict[str, list[float]]:
    """:func:`round_trips` sleeping and polling, taking turns, ``rounds`` times each."""
    out: dict[str, list[float]] = {"sleep": [], "poll": []}
    for r in range(rounds):
        for mode in ("sleep", "poll") if r % 2 == 0 else ("poll", "sleep"):
            out[mode].append(round_trips(mode == "poll", seconds))
    return out
