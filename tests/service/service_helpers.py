"""Helpers of the service tests: a small table with every dtype, rows that encode their id, Arrow bodies."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import testkit
import torch
from tensordict import TensorDict

from tdreplay.codec import encode, protocol
from tdreplay.service import Settings, create_app

ARROW = {"Content-Type": protocol.ARROW_STREAM}

FIELDS: dict[str, dict[str, Any]] = {
    **testkit.FIELDS,  # the storage tests' table, plus one field of every other dtype
    "mask": {"shape": [5], "dtype": "bool"},
    "small": {"shape": [], "dtype": "int8"},
    "wide": {"shape": [2], "dtype": "float64"},
    "count": {"shape": [], "dtype": "int16"},
    "code": {"shape": [], "dtype": "int32"},
}


def spec(name: str = "t", capacity: int = 64, **extra: Any) -> dict[str, Any]:
    """The JSON schema of a memory-backed table with one field of every dtype."""
    return {
        "name": name,
        "capacity": capacity,
        "fields": dict(FIELDS),
        "backend": {"kind": "memory"},
        **extra,
    }


def rows(start: int, n: int, *, episode_len: int = 10) -> TensorDict:
    """Items ``start .. start+n-1`` of :func:`spec`'s table; every field is a function of the id."""
    ids = torch.arange(start, start + n, dtype=torch.int64)
    return TensorDict(
        {
            "id": ids,
            "observation": ids[:, None].float().expand(n, 3) + torch.tensor([0.25, -0.5, 1e-3]),
            "action": (ids[:, None].float() / 7).bfloat16().expand(n, 2).clone(),
            "next": {
                "reward": (ids[:, None] / 3).half(),
                "done": (ids % episode_len == episode_len - 1)[:, None],
            },
            "pixels": (ids % 251).to(torch.uint8)[:, None, None].expand(n, 2, 2).clone(),
            "mask": (ids[:, None] + torch.arange(5)) % 3 == 0,
            "small": (ids % 127).to(torch.int8),
            "wide": ids[:, None].double().expand(n, 2) / 3,
            "count": (ids % 30000).to(torch.int16),
            "code": (ids * 7).to(torch.int32),
        },
        batch_size=[n],
    )


def body(start: int, n: int) -> bytes:
    return encode(rows(start, n)).to_pybytes()


def leaf_keys(td: TensorDict) -> list[tuple[str, ...]]:
    return [k if isinstance(k, tuple) else (k,) for k in td.keys(True, True)]


def assert_rows_match(batch: TensorDict) -> None:
    """Every sampled row equals, bit for bit, the row its ``id`` says was inserted."""
    expected = rows(0, int(batch["id"].max()) + 1)[batch["id"]]
    for key in leaf_keys(expected):
        got, want = batch.get(key), expected.get(key)
        assert got.dtype == want.dtype, key
        assert got.shape == want.shape, key
        if got.dtype == torch.bool:
            assert torch.equal(got, want), key
        else:
            assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8)), key


def create(client: Any, name: str = "t", capacity: int = 64, **extra: Any) -> dict[str, Any]:
    r = client.post(protocol.TABLES, json=spec(name, capacity, **extra))
    assert r.status_code == 201, r.text
    return r.json()


def extend(client: Any, start: int, n: int, name: str = "t", **headers: str) -> Any:
    return client.post(
        protocol.table_path(name, "extend"), content=body(start, n), headers={**ARROW, **headers}
    )


def info(client: Any, name: str = "t") -> dict[str, Any]:
    r = client.get(protocol.table_path(name))
    assert r.status_code == 200, r.text
    return r.json()


# ---------------------------------------------------------------- async clients
@contextlib.asynccontextmanager
async def served(root: Path, **settings: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """An app with its lifespan running and an async client on it, for tests of concurrency."""
    app = create_app(Settings(root=root, torch_threads=0, **settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tdreplay") as client:
            yield app, client


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Yield to the loop until ``condition()`` holds (the waiters have registered)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)
