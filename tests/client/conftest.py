"""Client test fixtures: real servers, small tables shaped like the shipped schemas."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Server:
    url: str
    root: Path
    token: str | None
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., _Server]]:
    """Start real ``tdreplay serve`` processes: ``live_server(token=None, **flags)``."""
    started: list[_Server] = []

    def start(token: str | None = None, **flags: Any) -> _Server:
        root = tmp_path_factory.mktemp("server")
        port = _free_port()
        args = [sys.executable, "-m", "tdreplay.service", "serve", "--root", str(root)]
        args += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        for k, v in flags.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        env = dict(os.environ)
        if token:
            env["TDREPLAY_TOKEN"] = token
        proc = subprocess.Popen(args, env=env, cwd=root)
        server = _Server(f"http://127.0.0.1:{port}", root, token, proc)
        started.append(server)
        deadline = time.monotonic() + 60
        while True:  # no event to wait on across processes: poll readiness
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"{server.url}/readyz", timeout=1):
                    return server
            except OSError:
                if time.monotonic() > deadline:
                    server.stop()
                    pytest.fail("server did not become ready")
                time.sleep(0.05)

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def server(live_server: Callable[..., _Server]) -> _Server:
    """One server shared by a test module (tables get unique names)."""
    return live_server()
