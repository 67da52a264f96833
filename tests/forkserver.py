"""Test servers forked from one process that imported tdreplay once.

A ``tdreplay serve`` spends ~2.5 s of its ~2.8 s start importing torch and
tensordict, and the suite starts about a hundred of them. :class:`ForkServer`
is a helper process (one per pytest process) that imports the server's code
once and forks a child per server: the child takes the request's working
folder, environment, log file and arguments and runs the very entry point
``python -m tdreplay.service`` runs (``tdreplay.cli.serve.main``), then exits
through the interpreter's normal shutdown. The helper is single-threaded and
has run no torch operation when it forks (multiprocessing's ``forkserver``
does the same). :class:`Forked` is the ``subprocess.Popen`` face of a child
that the tests use (``pid``, ``poll``, ``wait``, ``send_signal``,
``terminate``, ``kill``, ``returncode``). ``TDREPLAY_TEST_SPAWN=1`` starts every
server as a fresh interpreter instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_HELPER = r"""
import json, os, sys
import tdreplay.cli.serve as serve_cli  # what every server imports, once

def serve():
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "start":
            pid = os.fork()
            if pid == 0:
                return req  # the child: out of this loop, to run the server below
            print(json.dumps({"pid": pid}), flush=True)
        else:  # "poll": reap the child if it ended; its exit code, or null
            try:
                done, status = os.waitpid(req["pid"], os.WNOHANG)
            except ChildProcessError:
                done, status = req["pid"], -1
            code = None if done == 0 else (os.waitstatus_to_exitcode(status) if status != -1 else -1)
            print(json.dumps({"code": code}), flush=True)
    return None

req = serve()
if req is None:
    sys.exit(0)
log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.dup2(log, 1)
os.dup2(log, 2)
os.close(log)
os.close(null)
os.chdir(req["cwd"])
os.environ.clear()
os.environ.update(req["env"])
sys.argv = ["tdreplay", *req["argv"]]
serve_cli.main(req["argv"])
"""


class ForkServer:
    """The helper process; :meth:`start` forks a server from it. Thread safe."""

    def __init__(self, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HELPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=cwd,
            text=True,
        )
        self._lock = threading.Lock()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the test fork server ended ({self.proc.poll()})")
        return json.loads(line)

    def start(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> Forked:
        """A server as ``python -m tdreplay.service *argv`` would run it, output to ``log``."""
        request = {"op": "start", "argv": argv, "env": env, "cwd": str(cwd), "log": str(log)}
        return Forked(self, int(self._ask(request)["pid"]))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Forked:
    """A forked server, as much of ``subprocess.Popen`` as the tests use."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None
        self.args = ["tdreplay", "serve"]

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server._ask({"op": "poll", "pid": self.pid})["code"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
