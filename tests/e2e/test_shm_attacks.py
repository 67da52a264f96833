"""The same-host socket under abuse and misuse: each costs only its own connection, never the server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from test_shm import fd_count, spec, wait_until
from testkit import REPO, assert_consistent, rows

from tdreplay.client import ReplayClient, ServerError
from tdreplay.client.shm import Channel, ShmUnavailable
from tdreplay.codec.shm import (
    EXTEND,
    HEADER,
    SAMPLE,
    VERSION,
    extend_frame,
    frame,
    read_reply,
    release_frame,
    sample_frame,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create")


@pytest.fixture(scope="module")
def shared(live_server: Any) -> Any:
    """One plain server for the tests that need nothing else of it (each its own tables)."""
    return live_server()


def sock_path(server: Any) -> str:
    return str(server.root / "run" / "tdreplay.sock")


def raw(server: Any, token: str = "") -> socket.socket:
    """A raw connection that said hello."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(sock_path(server))
    s.sendall(frame({"op": "hello", "version": VERSION, "token": token}))
    assert read(s)["ok"] is True
    return s


def read(s: socket.socket) -> dict[str, Any]:
    header = s.recv(HEADER.size)
    assert len(header) == HEADER.size, header
    (n,) = HEADER.unpack(header)
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return read_reply(body)


def test_failed_samples_and_many_slots_cost_no_descriptors(shared: Any) -> None:
    server = shared
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("empty", {"kind": "uniform"}, capacity=16))
    client.create_table(spec("full", {"kind": "uniform"}, capacity=64))
    client.extend("full", rows(0, 64))
    before = fd_count(server.proc.pid)
    with raw(server) as s:
        for number in range(64):  # every one fails: nothing to sample
            s.sendall(sample_frame("empty", slot=number, batch_size=1, timeout=0))
            reply = read(s)
            assert reply["ok"] is False and reply["error"]["type"] == "EmptyTableError"
        for number in range(64):  # every one made and handed over
            s.sendall(sample_frame("full", slot=number, batch_size=2, timeout=1))
            reply, fds = _recv_reply(s)
            for fd in fds:
                os.close(fd)
            assert reply["ok"] is True
        # the connection and its writer only: the last slot's descriptor is closed as soon as
        # the reply carrying it is sent (which the client may see before the server goes on)
        wait_until(lambda: fd_count(server.proc.pid) <= before + 2)
        s.sendall(release_frame(1000))
        assert read(s)["error"]["field"] == "slot"  # a bad release is an error, not a crash
    wait_until(lambda: fd_count(server.proc.pid) <= before)


def test_a_sample_that_failed_on_a_new_slot_leaves_no_half_slot(shared: Any) -> None:
    server = shared
    client = ReplayClient(server.url, transport="shm")
    client.create_table(spec("late", {"kind": "uniform"}, capacity=16))
    with pytest.raises(ServerError):
        client.sample("late", 2, timeout=0)
    client.extend("late", rows(0, 16))
    for _ in range(6):  # the slot numbers that failed first now work, every time
        assert_consistent(client.sample("late", 2))


def test_a_replaced_table_gets_fresh_extend_slots(shared: Any) -> None:
    server = shared
    client = ReplayClient(server.url, transport="shm")
    client.create_table(spec("re", {"kind": "uniform"}, capacity=16))
    client.extend("re", rows(0, 4))
    client.delete_table("re")
    client.create_table(spec("re", {"kind": "fifo"}, capacity=32))
    assert client.extend("re", rows(0, 4)).tolist() == [0, 1, 2, 3]
    assert client.transport == "shm" and client.info("re")["inserts"] == 4


def test_a_socket_of_another_server_is_refused(shared: Any) -> None:
    server = shared
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
    assert len(client._driver.link(0)._channels) <= 5


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
        assert "--body-timeout" in read(s)["error"]["detail"]  # told why, then closed
        assert s.recv(10) == b""


def test_big_or_strange_hellos_are_refused(live_server: Any) -> None:
    server = live_server(token="a-token-for-hellos")
    for hello in [
        frame({"op": "hello", "version": VERSION, "token": "x" * 10_000}),  # too big, no token
        frame({"op": "hello", "version": True, "token": "a-token-for-hellos"}),
        frame({"op": "hello", "version": VERSION, "token": "\ud800"}),  # a lone surrogate
        # a client of the JSON-only protocol (before binary frames) is refused: it falls back
        frame({"op": "hello", "version": 1, "token": "a-token-for-hellos"}),
        HEADER.pack(10_000) + b"[" * 5000,
    ]:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(sock_path(server))
            s.sendall(hello)
            data = s.recv(65536)
            assert data and read_reply(data[HEADER.size :])["ok"] is False
            assert s.recv(10) == b""
    good = ReplayClient(server.url, token="a-token-for-hellos", transport="shm")
    assert good.transport == "shm"


def test_malformed_binary_frames_end_only_that_connection(shared: Any) -> None:
    """A binary frame whose layout is wrong (an unknown operation, too short, a name that
    is not UTF-8, a request id longer than the frame, a release of the wrong size) ends
    its connection with an error; values out of range are errors naming the field, and
    the connection goes on."""
    server = shared
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("bin", {"kind": "uniform"}, capacity=16))
    client.extend("bin", rows(0, 16))
    good = sample_frame("bin", slot=0, batch_size=2, timeout=1)
    for junk in [
        bytes([0x7F, 0, 0, 0]),  # no such operation
        bytes([SAMPLE, 0, 0]),  # shorter than a sample's fields
        good[HEADER.size :] + b"\xff\xfe",  # a table name that is not UTF-8
        bytes([EXTEND, 200]) + good[HEADER.size + 2 :],  # a request id past the end
        release_frame(1)[HEADER.size :] + b"x",  # a release of the wrong size
    ]:
        with raw(server) as s:
            s.sendall(HEADER.pack(len(junk)) + junk)
            reply = read(s)
            assert reply["ok"] is False and reply["error"]["type"] == "InvalidRequest", junk
            assert s.recv(10) == b""
    with raw(server) as s:
        for frame_, field in [
            (sample_frame("bin", slot=0, batch_size=2, timeout=-1.0), "timeout"),
            (sample_frame("bin", slot=0, batch_size=2, timeout=float("-inf")), "timeout"),
            (sample_frame("bin", slot=0, batch_size=0, timeout=1), "batch_size"),
            (sample_frame("bin", slot=0, batch_size=(1 << 32) - 1, timeout=1), "batch_size"),
            (sample_frame("bin", slot=65535, batch_size=2, timeout=1), "slot"),
            (sample_frame("nope", slot=0, batch_size=2, timeout=1), "name"),
            (extend_frame("bin", slot=0, rows=1, timeout=1, request_id="r"), "slot"),
        ]:
            s.sendall(frame_)
            reply = read(s)
            assert reply["ok"] is False and reply["error"]["field"] == field, (field, reply)
        s.sendall(good)
        reply, fds = _recv_reply(s)
        for fd in fds:
            os.close(fd)
        assert reply["ok"] is True and reply["rows"] == 2  # the connection still serves
    assert client.sample("bin", 2)["id"].shape == (2,)


def test_deeply_nested_or_huge_json_ends_only_that_connection(shared: Any) -> None:
    server = shared
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


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _recv_reply(s: socket.socket) -> tuple[dict[str, Any], list[int]]:
    header, fds, _, _ = socket.recv_fds(s, HEADER.size, 4)
    (n,) = HEADER.unpack(header)
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return read_reply(body), fds


WIDE = {"id": {"shape": [], "dtype": "int32"}, "x": {"shape": [65536], "dtype": "uint8"}}


def test_frame_fields_are_used_only_as_validated(live_server: Any) -> None:
    """What the metrics count is what the operation validated, never a raw field: a 50 KB
    row count of '000...1' is refused (a batch size like it once cost frame length x item
    bytes: 3 GB), a binary sample of one row counts one row, and an op that is no string
    is an error, not a crash."""
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table({"name": "w", "capacity": 8, "fields": WIDE, "backend": {"kind": "memory"}})
    client.extend("w", TensorDict({"id": torch.arange(8, dtype=torch.int32),
                                   "x": torch.zeros(8, 65536, dtype=torch.uint8)}, [8]))  # fmt: skip
    peak = _rss(server.proc.pid)
    with raw(server) as s:
        s.sendall(frame({"op": "extend_slot", "table": "w", "rows": "0" * 50_000 + "1", "slot": 1}))
        reply, fds = _recv_reply(s)
        assert reply["ok"] is False and reply["error"]["field"] == "rows" and not fds
        s.sendall(sample_frame("w", slot=0, batch_size=1, timeout=None))
        reply, fds = _recv_reply(s)
        for fd in fds:
            os.close(fd)
        assert reply["ok"] is True and reply["rows"] == 1
        for bad in [{"op": ["sample"], "table": "w"}, {"op": {"a": 1}}, {"op": None}]:
            s.sendall(frame(bad))
            answer = read(s)
            assert answer["ok"] is False and answer["error"]["field"] == "op", answer
        s.sendall(frame({"op": "info", "table": "w"}))
        assert read(s)["ok"] is True  # the connection still serves
    assert _rss(server.proc.pid) - peak < 64 << 20
    metrics = server.request("GET", "/metrics")[2].decode()
    sent = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("tdreplay_request_sent_bytes_total{")
        and 'transport="shm"' in line and 'op="sample"' in line and 'table="w"' in line
    ]  # fmt: skip
    assert len(sent) == 1 and 65540 <= sent[0] < 2 * 65540, sent  # one row, as validated
    log = server.log.read_text()
    assert "Traceback" not in log and "TypeError" not in log, log[-2000:]


def _held(fds: list[int]) -> int:
    """Bytes of memory the files behind ``fds`` hold (what a client keeps alive)."""
    return sum(os.fstat(fd).st_blocks * 512 for fd in fds)


def test_memory_handed_out_counts_until_reclaimed_across_reconnects(live_server: Any) -> None:
    """A client that reconnects again and again, keeping every descriptor it got, holds no
    more than --shm-total-bytes: slots of a finished connection stay counted until the
    server reclaims their memory (in the client's mapping too). A live connection's slots
    are never taken from it."""
    server = live_server(shm_connection_bytes=10_000_000, shm_total_bytes=25_000_000)
    http = ReplayClient(server.url, transport="http")
    http.create_table({"name": "w", "capacity": 64, "fields": WIDE, "backend": {"kind": "memory"}})
    honest = raw(server)
    honest.sendall(frame({"op": "extend_slot", "table": "w", "rows": 64, "slot": 0}))
    reply, mine = _recv_reply(honest)
    assert reply["ok"] is True and len(mine) == 1
    kept: list[int] = []
    try:
        for _ in range(20):
            with raw(server) as s:
                for slot in (0, 1):
                    s.sendall(frame({"op": "extend_slot", "table": "w", "rows": 64, "slot": slot}))
                    reply, fds = _recv_reply(s)
                    assert reply["ok"] is True, reply
                    kept += fds
            assert _held(kept) + _held(mine) <= 25_000_000
        assert _held(mine) >= 64 * 65540  # the live connection's slot was left alone
        honest.sendall(extend_frame("w", slot=0, rows=4, timeout=None, request_id=None))
        assert read(honest)["ok"] is True
    finally:
        honest.close()
        for fd in kept + mine:
            os.close(fd)


def test_a_departed_clients_slots_are_reclaimed_after_the_idle_timeout(live_server: Any) -> None:
    server = live_server(shm_idle_timeout=1)
    http = ReplayClient(server.url, transport="http")
    http.create_table({"name": "w", "capacity": 8, "fields": WIDE, "backend": {"kind": "memory"}})
    with raw(server) as s:
        s.sendall(frame({"op": "extend_slot", "table": "w", "rows": 8, "slot": 0}))
        reply, fds = _recv_reply(s)
        assert reply["ok"] is True
    try:
        assert _held(fds) >= 8 * 65540  # the departed client's batch stays readable a while
        wait_until(lambda: _held(fds) == 0, timeout=10)
    finally:
        for fd in fds:
            os.close(fd)


def test_the_server_changes_no_folder_it_did_not_create(tmp_path: Any, service: Any) -> None:
    """The app's start (in process: the lifespan a served app runs) refuses a socket in a
    folder others may enter, and leaves that folder as it was; a folder it makes is 0700."""
    from tdreplay.storage import InvalidRequest

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # /tmp's mode: the socket must not go there, nor change it
    with pytest.raises(InvalidRequest, match="changes no folder it did not create") as err:
        service(shm_socket=shared / "tdr.sock")
    assert "mode 1777" in str(err.value)
    assert oct(os.stat(shared).st_mode & 0o7777) == oct(0o1777) and not list(shared.iterdir())
    fresh = tmp_path / "mine" / "run"
    app = service(shm_socket=fresh / "tdr.sock")  # a folder it makes is its own: 0700
    assert os.stat(fresh).st_mode & 0o777 == 0o700
    info = app.get("/v1/info").json()
    assert info["shm"]["socket"] == str(fresh / "tdr.sock")


def test_a_huge_table_name_is_not_sent_back(shared: Any) -> None:
    """A frame may name a table in megabytes (the HTTP door caps a name at 64 characters in
    its path): the error quoted it three times (detail, table, got), 30 MB back for 10 MB,
    built on the event loop. It quotes the start of it once now."""
    server = shared
    name = "x" * 10_000_000
    with raw(server) as s:
        for request in [
            sample_frame(name, slot=0, batch_size=1, timeout=0),
            extend_frame(name, slot=0, rows=1, timeout=0, request_id=None),
            frame({"op": "info", "table": name}),
        ]:
            s.sendall(request)
            header = s.recv(HEADER.size, socket.MSG_WAITALL)
            (n,) = HEADER.unpack(header)
            assert n < 1000, n
            reply = read_reply(s.recv(n, socket.MSG_WAITALL))
            error = reply["error"]
            assert error["type"] == "TableNotFound" and error["field"] == "name", error
            assert "10000000 characters" in error["detail"], error
        s.sendall(frame({"op": "info", "table": "nope"}))
        assert read(s)["error"]["detail"] == "no table 'nope'"  # a short name: as it was
