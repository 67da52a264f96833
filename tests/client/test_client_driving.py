"""The two drivers (client/driving.py) perform the same steps the same way; only the waiting
differs. Driven here without a server: a port nothing listens on refuses at once."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Generator
from typing import Any

import pytest

from tdreplay.client import ConnectionFailed, TransportError
from tdreplay.client import commands as C
from tdreplay.client.driving import AsyncDriver, BlockingDriver
from tdreplay.client.retry import NO_RETRY
from tdreplay.client.settings import ClientSettings
from tdreplay.client.steps import Call, Gather, Pause, Work


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once it is closed


def settings(n: int) -> ClientSettings:
    urls = tuple(f"http://127.0.0.1:{closed_port()}" for _ in range(n))
    return ClientSettings(urls=urls, transport="http", retry=NO_RETRY, connect_timeout=2.0)


def both(s: ClientSettings, plan: Any) -> list[Any]:
    """``plan()``'s outcome under each driver: its result, or the error it raised."""
    out: list[Any] = []
    for driver in ("blocking", "asyncio"):
        try:
            if driver == "blocking":
                out.append(BlockingDriver(s).run(plan()))
            else:
                out.append(asyncio.run(AsyncDriver(s).run(plan())))
        except Exception as err:
            out.append(err)
    return out


def test_a_partial_gather_gives_each_unreached_server_its_error_as_result() -> None:
    s = settings(2)

    def plan() -> Generator[Any, Any, Any]:
        return (yield Gather([Call(0, C.Health()), Call(1, C.Health())], partial=True))

    for results in both(s, plan):
        assert [type(r) for r in results] == [ConnectionFailed, ConnectionFailed]


def test_an_unreached_server_is_thrown_into_the_plan_and_a_plain_gather_fails() -> None:
    s = settings(2)

    def plan() -> Generator[Any, Any, Any]:
        try:
            yield Call(0, C.Health())
        except TransportError as err:
            caught = type(err).__name__
        yield Pause(0.0)
        yield Gather([Call(0, C.Health()), Call(1, C.Health())])
        return caught

    assert [type(r) for r in both(s, plan)] == [ConnectionFailed, ConnectionFailed]

    def caught() -> Generator[Any, Any, Any]:
        try:
            yield Call(1, C.Health())
        except TransportError as err:
            return type(err).__name__

    assert both(s, caught) == ["ConnectionFailed", "ConnectionFailed"]


def test_the_plans_own_work_errors_go_back_to_it_and_its_results_too() -> None:
    def plan() -> Generator[Any, Any, Any]:
        n = yield Work(len, "abc")
        try:
            yield Work(int, "not a number")
        except ValueError as err:
            return n, str(err)

    assert (
        both(settings(1), plan)
        == [(3, "invalid literal for int() with base 10: 'not a number'")] * 2
    )


def test_a_plan_that_yields_no_step_fails_with_a_name_for_it() -> None:
    def plan() -> Generator[Any, Any, Any]:
        yield "hello"

    for err in both(settings(1), plan):
        assert isinstance(err, TypeError) and "'hello', which is not a step" in str(err)


@pytest.mark.parametrize("driver", [BlockingDriver, AsyncDriver])
def test_each_server_gets_its_transport_from_the_settings(driver: Any) -> None:
    s = settings(3)
    d = driver(s)
    assert [t.endpoint.port for t in d.transports] == [int(u.rsplit(":", 1)[1]) for u in s.urls]
    assert {(t.token, t.timeout, t.connect_timeout, t.max_idle) for t in d.transports} == {
        (s.token, s.timeout, s.connect_timeout, s.max_connections)
    }
