"""The same-host socket against a hostile local client, spoken to raw (frames, ``SCM_RIGHTS``,
the slots' memfds): each attack costs only its own connection, never the server, its other
clients, its tables or its descriptors."""

from __future__ import annotations

import ctypes
import fcntl
import os
import select
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from testkit import FIELDS, rows

from tdreplay.client import ReplayClient
from tdreplay.codec.shm import HEADER, VERSION, frame, read_reply, release_frame, sample_frame

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create")


def spec(name: str, capacity: int = 64) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": capacity,
        "fields": dict(FIELDS),
        "backend": {"kind": "memory"},
    }


def hello(server: Any, token: str = "") -> socket.socket:
    """A raw connection that said hello."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(str(server.root / "run" / "tdreplay.sock"))
    s.sendall(frame({"op": "hello", "version": VERSION, "token": token}))
    assert reply(s)[0]["ok"] is True
    return s


def reply(s: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The next reply and the descriptors that came with it."""
    header, fds, _, _ = socket.recv_fds(s, HEADER.size, 8)
    assert len(header) == HEADER.size, header
    (n,) = HEADER.unpack(header)
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return read_reply(body), fds


def closed(s: socket.socket, within: float = 10.0) -> bool:
    """Whether the server ends ``s`` within ``within`` seconds (what it sends is read over).
    A reset is an end too: a byte the client sent as the server closed lies unread there,
    and a socket closed with unread bytes resets its peer."""
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled(pid: int, count: int, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while fds_of(pid) > count and time.monotonic() < end:
        time.sleep(0.05)
    return fds_of(pid) <= count


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    server = live_server()
    http = ReplayClient(server.url, transport="http")
    http.create_table(spec("t"))
    http.extend("t", rows(0, 64))
    return server


def intact(server: Any) -> None:
    """Another client is served, over both doors, and the table holds what it held."""
    for transport in ("shm", "http"):
        client = ReplayClient(server.url, transport=transport)
        assert client.transport == transport
        batch = client.sample("t", 32)
        assert ((batch["id"] >= 0) & (batch["id"] < 64)).all()
        client.close()
    info = ReplayClient(server.url, transport="http").info("t")
    assert info["size"] == 64, info


def test_descriptors_sent_to_the_server_are_dropped(server: Any, tmp_path: Path) -> None:
    """A frame carrying descriptors (a flood of memfds, a pipe, a directory, a socket,
    /dev/zero) is read as the frame alone: the server keeps none of them."""
    pid = server.proc.pid
    before = fds_of(pid)
    r, w = os.pipe()
    kinds = [r, w, os.open(tmp_path, os.O_RDONLY), os.open("/dev/zero", os.O_RDWR)]
    pair = socket.socketpair()
    kinds += [pair[0].fileno()]
    flood = [os.memfd_create("flood") for _ in range(250)]
    try:
        with hello(server) as s:
            for fds in (kinds, flood):
                socket.send_fds(s, [sample_frame("t", slot=0, batch_size=2, timeout=1)], fds)
                answer, got = reply(s)
                assert answer["ok"] is True and len(got) <= 1
                for fd in got:
                    os.close(fd)
            socket.send_fds(s, [release_frame(0)], flood)
            assert reply(s) == ({"ok": True}, [])
    finally:
        for fd in [r, w, kinds[2], kinds[3], *flood]:
            os.close(fd)
        pair[0].close()
        pair[1].close()
    assert settled(pid, before)
    intact(server)


def test_a_slot_cannot_be_resized_or_resealed_by_its_client(server: Any) -> None:
    """The slot's memfd comes sealed: the client can neither shrink it under the server's
    mapping (SIGBUS there) nor grow it, nor lift or add seals; a hole punched in it costs
    only the client's own rows, and the server fills it again."""
    with hello(server) as s:
        s.sendall(sample_frame("t", slot=0, batch_size=8, timeout=1))
        _, (fd,) = reply(s)
        try:
            size = os.fstat(fd).st_size
            for n in (0, size // 2, size * 2):
                with pytest.raises(PermissionError):
                    os.ftruncate(fd, n)
            with pytest.raises(PermissionError):
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
            libc = ctypes.CDLL(None, use_errno=True)
            assert libc.fallocate(fd, 3, 0, size) == 0  # PUNCH_HOLE | KEEP_SIZE: allowed
            for _ in range(3):
                s.sendall(sample_frame("t", slot=0, batch_size=8, timeout=1))
                assert reply(s)[0]["ok"] is True
        finally:
            os.close(fd)
    intact(server)


def test_a_flood_of_connections_is_refused_with_the_flag(live_server: Any) -> None:
    server = live_server(shm_max_connections=4)
    http = ReplayClient(server.url, transport="http")
    http.create_table(spec("t"))
    http.extend("t", rows(0, 64))
    held = [hello(server) for _ in range(4)]
    with socket.socket(socket.AF_UNIX) as extra:
        extra.settimeout(10)
        extra.connect(str(server.root / "run" / "tdreplay.sock"))
        answer, _ = reply(extra)
        assert answer["ok"] is False and "--shm-max-connections" in answer["error"]["detail"]
    for s in held:
        s.close()
    time.sleep(0.5)
    intact(server)


def test_a_slot_released_twice_or_never_held(server: Any) -> None:
    with hello(server) as s:
        for frame_ in (release_frame(5), release_frame(5), release_frame(63)):
            s.sendall(frame_)
            assert reply(s) == ({"ok": True}, [])
        s.sendall(release_frame(64))
        answer, _ = reply(s)
        assert answer["ok"] is False and answer["error"]["field"] == "slot"
        for byte in sample_frame("t", slot=5, batch_size=3, timeout=1):  # one byte a send
            s.send(bytes([byte]))
        answer, fds = reply(s)
        for fd in fds:
            os.close(fd)
        assert answer["ok"] is True and answer["rows"] == 3 and len(fds) == 1
    intact(server)


def test_a_trickled_frame_is_ended_by_the_body_timeout(live_server: Any) -> None:
    """--body-timeout bounds a whole control frame, as it bounds an HTTP body: a client
    that sends one byte at a time, each in time, is ended all the same."""
    server = live_server(body_timeout=1.0)
    with hello(server) as s:
        body = frame({"op": "info", "table": "t", "pad": "x" * 100})
        s.sendall(body[:8])
        ended = False
        for byte in body[8:38]:  # 6 s of bytes, each 0.2 s after the last
            if select.select([s], [], [], 0.2)[0]:  # the server ended it (its error, then EOF)
                ended = closed(s)
                break
            s.sendall(bytes([byte]))
        assert ended


def test_frames_held_half_sent_count_with_the_bodies_received(live_server: Any) -> None:
    """A control frame being received counts whole in --max-receiving-bytes, as an HTTP body
    does: clients cannot park a frame per connection past what the server may hold. A frame
    past it is refused naming the flag; the bytes come back when its connection ends."""
    server = live_server(max_receiving_bytes=1 << 20)
    ReplayClient(server.url, transport="http").create_table(spec("t"))
    part = HEADER.pack(600 << 10) + b'{"op": "info", "table": "t", "pad": "'  # 600 KiB, to come
    with hello(server) as alone:
        alone.sendall(HEADER.pack(4 << 20) + part[HEADER.size :])  # 4 MiB: past it alone
        answer, _ = reply(alone)
        assert answer["error"]["type"] == "PayloadTooLarge", answer
        assert "--max-receiving-bytes" in answer["error"]["detail"] and closed(alone)
    first, second = hello(server), hello(server)
    first.sendall(part)
    time.sleep(0.5)  # held by the server
    second.sendall(part)
    answer, _ = reply(second)
    assert answer["error"]["type"] == "BackendError", answer  # 503: retry later
    assert "--max-receiving-bytes" in answer["error"]["detail"] and closed(second)
    first.close()
    for _ in range(100):  # the first one's bytes come back once the server sees it gone
        with hello(server) as third:
            third.sendall(part + b"x" * ((600 << 10) - len(part) + HEADER.size - 2) + b'"}')
            answer, _ = reply(third)
            if answer["ok"] or answer["error"]["type"] != "BackendError":
                break
        time.sleep(0.1)
    assert answer["ok"] is True and answer["info"]["size"] == 0, answer


def test_no_frame_is_served_before_the_token(live_server: Any) -> None:
    """On a server with a token, a client that skips the hello (a binary sample first, a JSON
    request first) or says it without the token gets no slot, no descriptor, no table."""
    server = live_server(token="shm-hostile-token")
    ReplayClient(server.url, token="shm-hostile-token", transport="http").create_table(spec("t"))
    for first in (
        sample_frame("t", slot=0, batch_size=1, timeout=0),
        frame({"op": "clear", "table": "t"}),
        frame({"op": "hello", "version": VERSION})
        + sample_frame("t", slot=0, batch_size=1, timeout=0),
    ):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(server.root / "run" / "tdreplay.sock"))
            s.sendall(first)
            answer, fds = reply(s)
            assert answer["ok"] is False and not fds, answer
            assert answer["error"]["type"] in ("InvalidRequest", "Unauthorized")
            assert closed(s)
    assert oct(os.stat(server.root / "run" / "tdreplay.sock").st_mode & 0o777) == "0o600"
