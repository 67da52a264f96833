"""Client test fixtures: a real server per test module (``live_server`` comes from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tdreplay.client import ReplayClient
from tdreplay.client.writer import Writer


@pytest.fixture(scope="module")
def server(live_server: Callable[..., Any]) -> Any:
    """One ``tdreplay serve`` process shared by a test module (tables get unique names)."""
    return live_server()


@pytest.fixture(params=["inline", "thread", "post"])
def make_writer(request: pytest.FixtureRequest, server: Any) -> Iterator[Callable[..., Writer]]:
    """Makes a :class:`Writer` that sends its full chunks one way: ``inline`` (waiting for
    the answer), ``thread`` (a sender thread) or ``post`` (over HTTP, the answer read by
    the next send: the default with one server there); ``make_writer.send`` says which."""
    http = ReplayClient(server.url, transport="http", timeout=30)
    background = {"inline": False, "thread": True, "post": None}[request.param]

    def make(client: ReplayClient, table: str, **kw: Any) -> Writer:
        return Writer(http if background is None else client, table, background=background, **kw)

    make.send = request.param  # type: ignore[attr-defined]
    yield make
    http.close()
