"""Fixtures of the TorchRL adapter tests: one real server per module, a table per test."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from torchrl_kit import table_spec

from tdreplay.client import ReplayClient

_names = itertools.count()


@pytest.fixture(scope="module")
def server(live_server: Callable[..., Any]) -> Any:
    """A ``tdreplay serve`` process (no schema: each test creates its tables)."""
    return live_server()


@pytest.fixture
def client(server: Any) -> Iterator[ReplayClient]:
    with ReplayClient(server.url) as c:
        yield c


@pytest.fixture
def make_table(client: ReplayClient) -> Callable[..., str]:
    """``make_table(sampler="uniform", capacity=4096) -> name``: a fresh CartPole table."""

    def make(**options: Any) -> str:
        name = f"cartpole_{next(_names)}"
        client.create_table(table_spec(name, **options))
        return name

    return make
