"""No request can make a real server connect where the operator did not say.

Redis connections are operator configuration (``--redis NAME=URL``); a table
spec only names one. Probes that try to name a host, port or socket are
refused at validation, and listening sockets the test owns show that no
connection was even attempted. A configured Redis that accepts and never
answers fails a create within ``--redis-timeout`` while the server keeps
serving.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tdreplay.codec import protocol

JSON = {"Content-Type": protocol.JSON}
REDIS_TIMEOUT = 1.0


class Listener:
    """A TCP (or Unix) socket that accepts connections in a thread and never answers; counts them."""

    def __init__(self, unix_path: Path | None = None) -> None:
        if unix_path is None:
            self.sock = socket.socket()
            self.sock.bind(("127.0.0.1", 0))
            self.port = self.sock.getsockname()[1]
        else:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.bind(str(unix_path))
            self.port = 0
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted.append(conn)  # held open, never answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


@pytest.fixture(scope="module")
def silent() -> Iterator[Listener]:
    """The operator's "evil" Redis: accepts, never answers."""
    listener = Listener()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def bait(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Listener]]:
    """Sockets a client may try to point the server at (none configured)."""
    tcp = Listener()
    unix = Listener(tmp_path_factory.mktemp("sock") / "redis.sock")
    yield {"tcp": tcp, "unix": unix}
    tcp.close()
    unix.close()


@pytest.fixture(scope="module")
def server(live_server: Any, silent: Listener) -> Any:
    return live_server(
        "--redis",  # several connections: one flag, space-separated values
        f"evil=redis://127.0.0.1:{silent.port}/0",
        f"closed=redis://127.0.0.1:{closed_port()}/0",
        redis_timeout=REDIS_TIMEOUT,
    )


def spec(name: str, **backend: Any) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": 8,
        "fields": {"x": {"shape": [2], "dtype": "float32"}},
        "backend": {"kind": "redis", **backend},
    }


def create(server: Any, body: dict[str, Any], timeout: float = 30) -> tuple[int, dict[str, Any]]:
    status, _, raw = server.request(
        "POST", protocol.TABLES, json.dumps(body).encode(), JSON, timeout=timeout
    )
    return status, json.loads(raw)


def names(server: Any) -> set[str]:
    status, _, raw = server.request("GET", protocol.TABLES)
    assert status == 200, raw
    return {t["name"] for t in json.loads(raw)["tables"]}


def test_a_request_cannot_name_a_host_port_or_socket(
    server: Any, bait: dict[str, Listener], silent: Listener
) -> None:
    port = bait["tcp"].port
    unix_path = bait["unix"].sock.getsockname()
    url = f"redis://127.0.0.1:{port}/0"
    attempts = [
        {"host": "127.0.0.1", "port": port},
        {"host": "127.0.0.1"},
        {"port": port},
        {"connection": "evil", "host": "127.0.0.1", "port": port},
        {"unix_socket_path": unix_path},
        {"connection": "evil", "unix_socket_path": unix_path},
        {"url": url},
        {"connection": url},  # a URL where a name goes
        {"connection": f"127.0.0.1:{port}"},
        {"connection": unix_path},
        {"prefix": "x", "address": f"127.0.0.1:{port}"},
        {"connection_pool": {"host": "127.0.0.1", "port": port}},
    ]
    held = len(silent.accepted)
    for i, backend in enumerate(attempts):
        status, body = create(server, spec(f"ssrf{i}", **backend))
        assert status == 422 and body["type"] == "SchemaError", (backend, body)
    # a spec with the fields at the top level is refused just the same
    status, body = create(server, {**spec("ssrf_top"), "host": "127.0.0.1", "port": port})
    assert status == 422, body
    time.sleep(1.0)  # time for any connection attempt to arrive
    assert bait["tcp"].accepted == [] and bait["unix"].accepted == []
    assert len(silent.accepted) == held  # the configured one was not dialled either
    assert names(server) == set()


def test_an_unconfigured_connection_is_refused_naming_the_configured_ones(
    server: Any, silent: Listener
) -> None:
    held = len(silent.accepted)
    start = time.monotonic()
    status, body = create(server, spec("nope", connection="nope"))
    assert time.monotonic() - start < 1.0
    assert status == 422 and body["type"] == "SchemaError", body
    assert "nope" in body["detail"], body
    assert "evil" in body["detail"] and "closed" in body["detail"], body
    assert len(silent.accepted) == held
    # the default connection is not configured on this server either
    status, body = create(server, spec("dflt"))
    assert status == 422 and "default" in body["detail"], body
    assert names(server) == set()


def test_a_silent_redis_fails_the_create_in_its_timeout_and_the_server_keeps_serving(
    server: Any, silent: Listener
) -> None:
    result: dict[str, Any] = {}

    def slow_create() -> None:
        start = time.monotonic()
        result["answer"] = create(server, spec("hung", connection="evil"), timeout=20)
        result["seconds"] = time.monotonic() - start

    worker = threading.Thread(target=slow_create)
    worker.start()
    probes = []
    while worker.is_alive():  # /healthz and the table list answer meanwhile, at once
        start = time.monotonic()
        status, _, _ = server.request("GET", "/healthz", timeout=2)
        assert status == 200
        assert names(server) == set()
        probes.append(time.monotonic() - start)
        time.sleep(0.1)
    worker.join()
    status, body = result["answer"]
    assert status == 503 and body["type"] == "BackendError", body
    assert REDIS_TIMEOUT * 0.8 < result["seconds"] < 3 * REDIS_TIMEOUT + 1, result
    assert len(silent.accepted) >= 1  # it did try the operator's Redis
    assert len(probes) >= 3 and max(probes) < 0.5, probes
    assert server.request("GET", "/healthz")[0] == 200
    assert names(server) == set()
    # nothing half-made is left: a create of the same name fails the same way, not with 409
    status, body = create(server, spec("hung", connection="evil"), timeout=20)
    assert status == 503 and body["type"] == "BackendError", body
    status, _, raw = server.request(
        "POST",
        protocol.TABLES,
        json.dumps({**spec("mem"), "backend": {"kind": "memory"}}).encode(),
        JSON,
    )
    assert status == 201, raw


def test_closed_and_silent_ports_look_alike_to_a_client(server: Any) -> None:
    """Only the operator can name either; the answers name the connection, not the address."""
    answers = {}
    for conn in ["closed", "evil"]:
        start = time.monotonic()
        status, body = create(server, spec(f"scan_{conn}", connection=conn), timeout=20)
        answers[conn] = (status, body["type"])
        assert time.monotonic() - start < 3 * REDIS_TIMEOUT + 1
        assert conn in body["detail"], body
    assert answers["closed"] == answers["evil"] == (503, "BackendError"), answers
