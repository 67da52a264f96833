"""The same-host socket's time limits tell the client which one ended its connection: a frame
not whole within ``--body-timeout``, no request within ``--shm-idle-timeout``, no hello within
``--shm-hello-timeout`` are answered with HTTP's error for a timeout (408 ``InvalidRequest``
naming the flag), then the connection is closed. (``--send-timeout`` ends a client that is not
reading: nothing is sent.)"""

from __future__ import annotations

import os
import select
import socket
from typing import Any

import pytest
from pydantic import ValidationError
from test_shm_hostile import closed, hello, reply, spec
from testkit import rows

from tdreplay.client import ConnectionFailed, InvalidRequest, ReplayClient
from tdreplay.client.shm import Channel
from tdreplay.codec.shm import HEADER, IDLE_ENDED, release_frame, sample_frame
from tdreplay.service import Settings

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create")


def sock_path(server: Any) -> str:
    return str(server.root / "run" / "tdreplay.sock")


def timed_out(answer: dict[str, Any], flag: str) -> bool:
    """Whether ``answer`` is the error of the time limit ``flag`` (HTTP's: 408, InvalidRequest)."""
    error = answer["error"]
    return (
        answer["ok"] is False
        and answer["status"] == 408
        and error["type"] == "InvalidRequest"
        and flag in error["detail"]
    )


def test_a_frame_not_whole_in_time_is_answered_naming_the_body_timeout(live_server: Any) -> None:
    server = live_server(body_timeout=0.5)
    with hello(server) as s:
        s.sendall(HEADER.pack(100) + b'{"op": ')  # a frame that never completes
        answer, _ = reply(s)
        assert timed_out(answer, "--body-timeout"), answer
        assert answer["error"]["field"] == "body" and "11 of 104 bytes" in answer["error"]["got"]
        assert closed(s)


def test_a_client_waiting_on_a_frame_cut_by_the_body_timeout_raises_its_error(
    live_server: Any,
) -> None:
    """The client's channel reads the error as the answer to its call: the server's error
    (408 InvalidRequest, as over HTTP), not a lost connection."""
    server = live_server(body_timeout=0.5)
    chan = Channel(sock_path(server), None, timeout=10.0, lease_slots=1)
    try:
        with pytest.raises(InvalidRequest, match="--body-timeout") as err:
            chan.call(HEADER.pack(100) + b'{"op": ', wait=0)  # sent, never completed
        assert err.value.status == 408
        assert chan.sock.fileno() < 0  # the server ended it: the next call connects anew
    finally:
        chan.close()


def test_a_client_cut_off_part_way_through_sending_a_frame_raises_the_servers_error(
    live_server: Any,
) -> None:
    """A client stalled part-way through sending a frame (its first bytes out, the rest
    after --body-timeout) finds the connection closed when it sends the rest: it raises
    what the server answered, that it did not run the request (408 InvalidRequest naming
    the flag), not a connection lost with the request maybe done (``sent``)."""
    server = live_server(body_timeout=0.5)
    chan = Channel(sock_path(server), None, timeout=10.0, lease_slots=1)
    try:
        message = sample_frame("t", slot=0, batch_size=1, timeout=0)
        chan.sock.sendall(message[:5])  # the first bytes, then the client stalls
        hung_up = select.poll()  # the server answered and closed its end (nothing read here)
        hung_up.register(chan.sock, select.POLLRDHUP)
        assert hung_up.poll(10_000)
        with pytest.raises(InvalidRequest, match="--body-timeout") as err:
            chan.call(message[5:], wait=0)  # the rest: the send fails, the answer lies unread
        assert err.value.status == 408 and err.value.field == "body"
        assert chan.sock.fileno() < 0  # the next call connects anew
    finally:
        chan.close()


def test_an_idle_connection_is_told_before_it_is_closed(live_server: Any) -> None:
    server = live_server(shm_idle_timeout=0.5)
    with hello(server) as s:
        s.settimeout(10)
        answer, _ = reply(s)  # nothing asked: what comes is the reason it ends
        assert timed_out(answer, "--shm-idle-timeout"), answer
        assert answer["error"]["field"] == IDLE_ENDED and closed(s)


def test_a_client_calling_on_an_idle_ended_connection_learns_why(live_server: Any) -> None:
    """The server read nothing after it ended the connection: the call's request was not
    read, so it fails as a connection lost before sending (a retry or HTTP may carry it),
    and says why, whether its send failed (the connection closed) or went out first."""
    server = live_server(shm_idle_timeout=0.5)
    chan = Channel(sock_path(server), None, timeout=10.0, lease_slots=1)
    try:
        assert select.select([chan.sock], [], [], 10)[0]  # the server's reason came
        with pytest.raises(ConnectionFailed, match="--shm-idle-timeout") as err:
            chan.call(release_frame(0), wait=0)
        assert err.value.sent is False
    finally:
        chan.close()


def test_a_connection_that_never_says_hello_is_closed_and_makes_room(live_server: Any) -> None:
    """--shm-hello-timeout: a connection that says nothing is told and closed, and no longer
    counts against --shm-max-connections."""
    server = live_server(shm_hello_timeout=1, shm_max_connections=1)
    ReplayClient(server.url, transport="http").create_table(spec("t"))
    ReplayClient(server.url, transport="http").extend("t", rows(0, 8))
    with socket.socket(socket.AF_UNIX) as silent:
        silent.settimeout(10)
        silent.connect(sock_path(server))
        with socket.socket(socket.AF_UNIX) as second:  # the one connection is taken
            second.settimeout(10)
            second.connect(sock_path(server))
            answer, _ = reply(second)
            assert answer["error"]["type"] == "InsufficientStorage", answer
            assert "--shm-max-connections" in answer["error"]["detail"]
        answer, _ = reply(silent)
        assert timed_out(answer, "--shm-hello-timeout"), answer
        assert "within 1 s" in answer["error"]["detail"] and closed(silent)
    client = ReplayClient(server.url, transport="shm")  # room again
    assert client.transport == "shm" and client.sample("t", 4)["id"].shape == (4,)
    client.close()


def test_the_hello_timeout_is_checked() -> None:
    with pytest.raises(ValidationError, match="shm_hello_timeout"):
        Settings(shm_hello_timeout=0)
    assert Settings(shm_hello_timeout=2.5).shm_hello_timeout == 2.5
