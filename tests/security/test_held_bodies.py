"""Extends the rate limiter holds back keep their bodies: those count in ``--max-receiving-bytes``.

An extend waiting for the rate limiter holds its request body (its rows view
it) until the wait ends, up to ``--max-timeout`` seconds. Before, only bodies
being received counted: once received, a body left the count, so any number
of waiting extends grew the server without bound (48 waiting extends of 1 MiB
here: +52.5 MiB of RSS, and not one refused).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from testkit import REPO, free_port

from tdreplay.codec import encode, protocol

MiB = 1 << 20
LIMIT = 8 * MiB  # --max-receiving-bytes
CALLS = 48  # extends of one 1 MiB row each, all at once
WAIT = 3.0  # seconds each may wait for the rate limiter
EXTEND = protocol.table_path("big", "extend")


def rss(pid: int) -> int:
    """Resident bytes of process ``pid``, now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def request(port: int, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        kind = "application/json" if path == "/v1/tables" else protocol.ARROW_STREAM
        conn.request(method, path, body=body or None, headers={"Content-Type": kind})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def rows(n: int) -> bytes:
    x = torch.full((n, MiB), 7, dtype=torch.uint8)
    return encode(TensorDict({"x": x}, batch_size=[n])).to_pybytes()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, int]]:
    folder = tmp_path_factory.mktemp("held-bodies")
    port = free_port()
    # RSS is measured: none of the caller's allocator tuning, nothing pooled, big arrays mmapped
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TDREPLAY_", "MALLOC_"))}
    argv = ["serve", "--host", "127.0.0.1", "--port", str(port), "--root", str(folder / "data")]
    argv += ["--log-level", "warning", "--pooled-bytes", "0", "--malloc-mmap-threshold", str(MiB)]
    argv += ["--max-receiving-bytes", str(LIMIT)]
    with (folder / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tdreplay.service", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (folder / "server.log").read_text()
            try:
                if request(port, "GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server never got ready"
            time.sleep(0.1)
        spec = {
            "name": "big",
            "capacity": 64,
            "fields": {"x": {"shape": [MiB], "dtype": "uint8"}},
            "backend": {"kind": "memory"},
            # two rows in, and every insert is held back until something is sampled
            "rate_limiter": {"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": 1},
        }
        assert request(port, "POST", "/v1/tables", json.dumps(spec).encode())[0] == 201
        assert request(port, "POST", EXTEND, rows(2))[0] == 200
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def test_waiting_extends_count_in_the_receiving_limit(server: tuple[subprocess.Popen, int]) -> None:
    proc, port = server
    body = rows(1)
    path = f"{EXTEND}?timeout={WAIT}"
    assert request(port, "POST", f"{EXTEND}?timeout=0.2", body)[0] == 429  # one-time costs
    base = rss(proc.pid)
    answers: list[tuple[int, bytes]] = []

    def extend() -> None:
        answers.append(request(port, "POST", path, body))

    threads = [threading.Thread(target=extend) for _ in range(CALLS)]
    for t in threads:
        t.start()
    peak = base
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss(proc.pid))
        time.sleep(0.02)
    statuses = sorted(status for status, _ in answers)
    refused = [json.loads(a) for status, a in answers if status == 503]
    waited = statuses.count(429)  # held back until their timeout
    assert len(answers) == CALLS and waited + len(refused) == CALLS, statuses
    assert waited <= LIMIT // MiB, statuses  # no more wait than the limit holds rows of
    assert refused and all(
        a["type"] == "BackendError" and "--max-receiving-bytes" in a["detail"]
        and str(LIMIT) in a["detail"]
        for a in refused
    ), refused[:1]  # fmt: skip
    # what the waiting extends held: the limit's worth and the bodies on their way (9.5 to
    # 11.6 MiB measured), not one body per call (52.5 MiB before)
    assert peak - base < LIMIT + 12 * MiB, (peak - base) / MiB
    status, _ = request(port, "POST", protocol.table_path("big", "sample") + "?batch_size=2")
    assert status == 200  # the server goes on: a sample lets the next extend in
    assert request(port, "POST", EXTEND, body)[0] == 200
