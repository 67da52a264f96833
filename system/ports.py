"""Free loopback ports for the servers the test suite and the benchmarks start, each its own.

A port picked by ``bind(("", 0))`` lies in the kernel's ephemeral range (32768+ here), where
client connections and other processes' servers (a Ray worker's gRPC) take ports meanwhile:
one picked there may be taken before the server binds it, and a readiness poll then reaches
that other server. :func:`free_port` walks a slice below that range instead; the suite and
the benchmarks each have their own (:data:`TEST_PORTS`, a part per pytest-xdist worker, and
:data:`BENCH_PORTS`), and each process walks from a start of its own, so two runs at once (two
checkouts, a benchmark beside the suite) do not walk a slice in step (seen: a server of one
run answering the other's health check). Standard library only: the benchmarks' module that
picks their ports runs where tdreplay's dependencies are not installed.

    >>> set(TEST_PORTS).isdisjoint(BENCH_PORTS)
    True
    >>> free_port(BENCH_PORTS) in BENCH_PORTS
    True
"""

from __future__ import annotations

import itertools
import os
import socket

__all__ = ["BENCH_PORTS", "TEST_PORTS", "free_port"]

#: the test suite's ports: a part of :data:`TEST_SPAN` for each of ten pytest-xdist workers
TEST_PORTS = range(12000, 32000)
TEST_SPAN = 2000
#: the benchmarks' ports: apart from the suite's and from Ray's worker ports (10002-19999)
BENCH_PORTS = range(5000, 7000)

#: where this process starts in a slice
_TURN = itertools.count(os.getpid() * 7919)


def free_port(ports: range) -> int:
    """A port of ``ports`` free on 127.0.0.1 now, tried from this process' next start on.

    Raises:
        RuntimeError: every port of ``ports`` is taken.
    """
    for _ in range(len(ports)):
        port = ports[next(_TURN) % len(ports)]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{ports.start}, {ports.stop})")
