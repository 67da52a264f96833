"""Attacks on the server's polling of a same-host connection: every kind of request answered
from a poll, and a client killed while polled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from test_shm import fd_count, wait_until
from test_shm_attacks import _recv_reply, raw
from test_shm_polling import filled, polls
from testkit import REPO

from tdreplay.codec.shm import frame, release_frame, sample_frame
from tdreplay.system import cpu_to_spare

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create")


def shm_requests(server: Any) -> float:
    text = server.request("GET", "/metrics")[2].decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tdreplay_requests_total{") and 'transport="shm"' in line
    )


def test_every_kind_of_request_is_answered_and_counted_from_a_poll(live_server: Any) -> None:
    server = live_server(shm_poll_us=100_000)
    filled(server, "t")
    requests = [
        sample_frame("t", slot=0, batch_size=1, timeout=0),
        sample_frame("t", slot=1, batch_size=2, timeout=0),
        frame({"op": "info", "table": "t"}),  # a JSON request: a task
        sample_frame("t", slot=0, batch_size=1, timeout=0),
        sample_frame("none", slot=0, batch_size=1, timeout=0),  # an error
        release_frame(1),
        frame({"op": "update_priority", "table": "t", "index": [0], "priority": [2.0]}),
        sample_frame("t", slot=0, batch_size=1, timeout=0),
    ]
    before = shm_requests(server)
    rounds, seen = [], []
    with raw(server) as s:
        for _ in range(3):  # each request sent as soon as the last was answered: polled
            answers = []
            for request in requests:
                s.sendall(request)
                reply, fds = _recv_reply(s)
                for fd in fds:
                    os.close(fd)
                answers.append(reply["ok"])
                seen.append(cpu_to_spare())
            rounds.append(answers)
    assert rounds[0][:6] == [True, True, True, True, False, True] and rounds[0][-1], rounds
    assert rounds[0] == rounds[1] == rounds[2], rounds
    wait_until(lambda: shm_requests(server) - before == 3 * len(requests))
    if all(seen):  # polling is off while the machine has no CPU to spare
        assert polls(server)["found"] > 0  # some were read by the poll
    assert "Traceback" not in server.log.read_text()


TIGHT = """
import sys
from tdreplay.client import ReplayClient
with ReplayClient(sys.argv[1], transport="shm", shm_poll_us=100_000) as c:
    c.sample("t", 1)
    print("calling", flush=True)
    while True:
        c.sample("t", 1)
"""


def test_a_client_killed_while_polled_frees_its_connection(live_server: Any) -> None:
    server = live_server(shm_poll_us=100_000)
    filled(server, "t")
    before = fd_count(server.proc.pid)
    seen = []
    for _ in range(2):
        client = subprocess.Popen(
            [sys.executable, "-c", TIGHT, server.url], cwd=REPO, stdout=subprocess.PIPE
        )
        assert client.stdout is not None
        assert client.stdout.readline() == b"calling\n"
        for _ in range(20):
            seen.append(cpu_to_spare())
            time.sleep(0.01)
        client.send_signal(signal.SIGKILL)
        client.wait()
        client.stdout.close()
    wait_until(lambda: fd_count(server.proc.pid) <= before)
    if all(seen):  # polling is off while the machine has no CPU to spare
        assert polls(server)["found"] > 0
    with raw(server) as s:  # the server serves on
        s.sendall(sample_frame("t", slot=0, batch_size=1, timeout=0))
        reply, fds = _recv_reply(s)
        for fd in fds:
            os.close(fd)
        assert reply["ok"] is True
    assert "Traceback" not in server.log.read_text()
