"""The same-host socket under abuse and misuse: each costs only its own connection, never the server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from test_shm import fd_count, spec, wait_until
from testkit import REPO, assert_consistent, rows

from tdreplay.client import ReplayClient, ServerError
from tdreplay.client.shm import Channel, ShmUnavailable
from tdreplay.codec.shm import HEADER, frame, parse_frame

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create")


def sock_path(server: Any) -> str:
    return str(server.root / "run" / "tdreplay.sock")


def raw(server: Any, token: str = "") -> socket.socket:
    """A raw connection that said hello."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(sock_path(server))
    s.sendall(frame({"op": "hello", "version": 1, "token": token}))
    assert read(s)["ok"] is True
    return s


def read(s: socket.socket) -> dict[str, Any]:
    header = s.recv(HEADER.size)
    assert len(header) == HEADER.size, header
    (n,) = HEADER.unpack(header)
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return parse_frame(body)


def test_failed_samples_and_many_slots_cost_no_descriptors(live_server: Any) -> None:
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("empty", {"kind": "uniform"}, capacity=16))
    client.create_table(spec("full", {"kind": "uniform"}, capacity=64))
    client.extend("full", rows(0, 64))
    before = fd_count(server.proc.pid)
    with raw(server) as s:
        for number in range(64):  # every one fails: nothing to sample
            s.sendall(
                frame(
                    {
                        "op": "sample",
                        "table": "empty",
                        "batch_size": 1,
                        "slot": number,
                        "timeout": 0,
                    }
                )
            )
            reply = read(s)
            assert reply["ok"] is False and reply["error"]["type"] == "RateLimitTimeout"
        for number in range(64):  # every one made and handed over
            s.sendall(
                frame(
                    {"op": "sample", "table": "full", "batch_size": 2, "slot": number, "timeout": 1}
                )
            )
            header, fds, _, _ = socket.recv_fds(s, HEADER.size, 4)
            for fd in fds:
                os.close(fd)
            (n,) = HEADER.unpack(header)
            assert parse_frame(s.recv(n))["ok"] is True
        # the connection and its writer only: the last slot's descriptor is closed as soon as
        # the reply carrying it is sent (which the client may see before the server goes on)
        wait_until(lambda: fd_count(server.proc.pid) <= before + 2)
        s.sendall(frame({"op": "release", "slot": [0]}))
        assert read(s)["error"]["field"] == "slot"  # a bad release is an error, not a crash
    wait_until(lambda: fd_count(server.proc.pid) <= before)


def test_a_sample_that_failed_on_a_new_slot_leaves_no_half_slot(live_server: Any) -> None:
    server = live_server()
    client = ReplayClient(server.url, transport="shm")
    client.create_table(spec("late", {"kind": "uniform"}, capacity=16))
    with pytest.raises(ServerError):
        client.sample("late", 2, timeout=0)
    client.extend("late", rows(0, 16))
    for _ in range(6):  # the slot numbers that failed first now work, every time
        assert_consistent(client.sample("late", 2))


def test_a_replaced_table_gets_fresh_extend_slots(live_server: Any) -> None:
    server = live_server()
    client = ReplayClient(server.url, transport="shm")
    client.create_table(spec("re", {"kind": "uniform"}, capacity=16))
    client.extend("re", rows(0, 4))
    client.delete_table("re")
    client.create_table(spec("re", {"kind": "fifo"}, capacity=32))
    assert client.extend("re", rows(0, 4)).tolist() == [0, 1, 2, 3]
    assert client.transport == "shm" and client.info("re")["inserts"] == 4


def test_a_socket_of_another_server_is_refused(live_server: Any) -> None:
    server = live_server()
    with pytest.raises(ShmUnavailable, match="not the one asked over HTTP"):
        Channel(sock_path(server), None, 5.0, 2, instance="another-server")


def test_finished_threads_leave_no_connections(live_server: Any) -> None:
    server = live_server(shm_max_connections=8)
    client = ReplayClient(server.url, transport="shm")
    client.create_table(spec("l", {"kind": "uniform"}, capacity=64))
    client.extend("l", rows(0, 64))
    for _ in range(6):  # 4 fetcher threads a pass: 24 threads, never more than 8 connections
        batches = list(client.loader("l", 8, prefetch=4, num_batches=4, keep=True))
        assert len(batches) == 4
    assert client.transport == "shm"
    assert len(client._link(0)._channels) <= 5


def test_many_batch_sizes_reuse_slot_numbers(live_server: Any) -> None:
    server = live_server(shm_max_slots=8)
    client = ReplayClient(server.url, transport="shm")
    client.create_table(spec("sizes", {"kind": "uniform"}, capacity=64))
    client.extend("sizes", rows(0, 64))
    for n in range(1, 41):  # 40 sizes x 2 slots, 8 slots a connection
        assert client.sample("sizes", n)["id"].shape == (n,)


def test_idle_and_half_sent_connections_are_ended(live_server: Any) -> None:
    server = live_server(shm_idle_timeout=0.5, body_timeout=0.5)
    client = ReplayClient(server.url)  # auto
    client.create_table(spec("idle", {"kind": "uniform"}, capacity=16))
    client.extend("idle", rows(0, 16))
    assert client.sample("idle", 2)["id"].shape == (2,)
    time.sleep(1.0)  # the server ended the idle connection meanwhile
    for _ in range(3):
        assert_consistent(client.sample("idle", 2))  # and the client carried on
    with raw(server) as s:
        s.sendall(HEADER.pack(100) + b'{"op": ')  # a frame that never completes
        s.settimeout(5)
        assert s.recv(10) == b""  # closed by the server after --body-timeout


def test_big_or_strange_hellos_are_refused(live_server: Any) -> None:
    server = live_server(token="a-token-for-hellos")
    for hello in [
        frame({"op": "hello", "version": 1, "token": "x" * 10_000}),  # too big before the token
        frame({"op": "hello", "version": True, "token": "a-token-for-hellos"}),
        frame({"op": "hello", "version": 1, "token": "\ud800"}),  # a lone surrogate
        HEADER.pack(10_000) + b"[" * 5000,
    ]:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(sock_path(server))
            s.sendall(hello)
            data = s.recv(65536)
            assert data and parse_frame(data[HEADER.size :])["ok"] is False
            assert s.recv(10) == b""
    good = ReplayClient(server.url, token="a-token-for-hellos", transport="shm")
    assert good.transport == "shm"


def test_deeply_nested_or_huge_json_ends_only_that_connection(live_server: Any) -> None:
    server = live_server()
    for body in [b"[" * 100_000 + b"]" * 100_000, b'{"slot": ' + b"9" * 100_000 + b"}"]:
        with raw(server) as s:
            s.sendall(HEADER.pack(len(body)) + body)
            reply = read(s)
            assert reply["ok"] is False and reply["error"]["type"] == "InvalidRequest"
    assert ReplayClient(server.url, transport="shm").transport == "shm"


def test_the_servers_shared_memory_is_bounded_across_connections(live_server: Any) -> None:
    server = live_server(shm_total_bytes=64 * 1024)
    http = ReplayClient(server.url, transport="http")
    http.create_table(spec("t", {"kind": "uniform"}, capacity=1024))
    http.extend("t", rows(0, 1024))
    a = ReplayClient(server.url, transport="shm", lease_slots=1)
    b = ReplayClient(server.url, transport="shm", lease_slots=1)
    assert a.sample("t", 512)["id"].shape == (512,)  # ~27 KB of slot
    with pytest.raises(ServerError) as err:
        b.sample("t", 1024)  # ~54 KB more: past the server's 64 KiB
    assert err.value.type == "InsufficientStorage" and "--shm-total-bytes" in err.value.detail
    a.close()  # a's slots go with its connection
    wait_until(lambda: _fits(b))


def _fits(client: ReplayClient) -> bool:
    try:
        return client.sample("t", 1024)["id"].shape == (1024,)
    except ServerError:
        return False


def test_a_live_socket_at_the_path_is_never_taken_over(tmp_path: Any) -> None:
    path = tmp_path / "taken.sock"
    owner = socket.socket(socket.AF_UNIX)
    owner.bind(str(path))
    owner.listen(1)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tdreplay.service", "serve", "--root", str(tmp_path / "data"),
             "--port", "0", "--shm-socket", str(path)],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode != 0
        assert "another process listens on it" in proc.stderr + proc.stdout
        assert path.is_socket()  # still the owner's
        with socket.socket(socket.AF_UNIX) as probe:
            probe.connect(str(path))
    finally:
        owner.close()
