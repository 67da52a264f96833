"""What the end-to-end modules share: a real server per module (``server``), and a client of
it per test (``client``). A module needing another server defines its own ``server``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tdreplay.client import ReplayClient


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    """A server of the defaults (memmap, no schema), for this module's tests."""
    return live_server()


@pytest.fixture
def client(server: Any) -> Iterator[ReplayClient]:
    with ReplayClient(server.url) as c:
        yield c
