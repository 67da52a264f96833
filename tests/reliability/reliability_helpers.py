"""HTTP helpers on a :class:`LiveServer` (tests/conftest.py): a table, its rows, its size;
and a ``redis-server`` of a test's own (:class:`RedisProcess`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib
from service_helpers import ARROW, assert_rows_match, body, spec
from testkit import free_port

from tdreplay.codec import decode, protocol


def call(server: Any, method: str, path: str, **kw: Any) -> Any:
    status, _, raw = server.request(method, path, **kw)
    assert status < 300, (status, raw[:500], server.output()[-2000:])
    return raw


def create(server: Any, name: str = "t", capacity: int = 64, **extra: Any) -> None:
    payload = json.dumps(spec(name, capacity, **extra)).encode()
    call(
        server, "POST", protocol.TABLES, body=payload, headers={"Content-Type": "application/json"}
    )


def extend(server: Any, start: int, n: int, name: str = "t") -> None:
    call(server, "POST", protocol.table_path(name, "extend"), body=body(start, n), headers=ARROW)


def size(server: Any, name: str = "t") -> int:
    return json.loads(call(server, "GET", protocol.table_path(name)))["size"]


def names(server: Any) -> list[str]:
    return sorted(t["name"] for t in json.loads(call(server, "GET", protocol.TABLES))["tables"])


def check_rows(server: Any, n: int, name: str = "t", batch: int = 256) -> None:
    """The table holds rows 0..n-1 of service_helpers.rows, bit for bit."""
    assert size(server, name) == n
    raw = call(server, "POST", protocol.table_path(name, "sample") + f"?batch_size={batch}")
    sampled = decode(raw)
    assert int(sampled["id"].max()) < n
    assert_rows_match(sampled)


def state_until(server: Any, state: str, name: str = "rt") -> dict[str, Any]:
    """The table's info once its ``state`` is ``state`` (within 15 s)."""
    deadline = time.monotonic() + 15
    while True:
        status, _, raw = server.request("GET", protocol.table_path(name))
        info = json.loads(raw)
        if (status, info.get("state")) == (200, state) or time.monotonic() > deadline:
            assert (status, info.get("state")) == (200, state), raw[:300]
            return dict(info)
        time.sleep(0.1)


def env() -> dict[str, str]:
    """The test environment less its ``TDREPLAY_*`` variables (as ``live_server`` does)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TDREPLAY_")}


def python(*args: str) -> subprocess.Popen:
    """``python *args`` with stdout and stderr together, as text."""
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(),
    )


class RedisProcess:
    """A redis-server on a fixed port that can be killed, restarted empty, stopped and continued."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = redis_lib.Redis(port=self.port, socket_timeout=5)

    def start(self, *extra: str) -> None:
        """Start it (again), with ``extra`` arguments (``--maxmemory 8mb``)."""
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed (make redis installs it)")
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.workdir), *extra]
        self.proc = subprocess.Popen(
            [exe, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                return
            except redis_lib.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    pytest.fail("redis-server did not start")
                time.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
