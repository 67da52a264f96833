"""Start a tdreplay server for an example when no ``--url`` is given.

    >>> with local_server() as url:          # doctest: +SKIP
    ...     client = ReplayClient(url)

The server is ``python -m tdreplay.service serve`` on a free loopback port
with a temporary data root, stopped (SIGTERM) when the block ends.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from tdreplay.client import ReplayClient, TransportError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def local_server(url: str | None = None, *, timeout: float = 60.0) -> Iterator[str]:
    """Yield ``url`` as it is, or the URL of a server started for the block."""
    if url is not None:
        yield url
        return
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tdreplay-example-") as root:
        cmd = [sys.executable, "-m", "tdreplay.service", "serve", "--port", str(port)]
        cmd += ["--root", root, "--log-level", "warning"]
        proc = subprocess.Popen(cmd)
        url = f"http://127.0.0.1:{port}"
        try:
            client = ReplayClient(url, transport="http", connect_timeout=1.0)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    client.health()
                    break
                except TransportError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the tdreplay server did not start ({cmd})") from None
                    time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            proc.wait(30)
