"""A sample's batch size is checked once per call, whatever the door; a reused buffer's
once, and a door's buffers laid out by a shape once per batch size."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch
from service_helpers import ARROW, body, served, spec
from tensordict import TensorDict

from tdreplay.codec import protocol
from tdreplay.codec.params import (
    BufferParams,
    SampleParams,
)
from tdreplay.service.core import Shape


def _count(table: Any, method: str) -> list[int]:
    calls: list[int] = []
    original = getattr(table, method)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    setattr(table, method, counted)
    return calls


def test_an_http_sample_checks_its_batch_size_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with served(tmp_path) as (app, client):
            await client.post(protocol.TABLES, json=spec())
            await client.post(protocol.table_path("t", "extend"), content=body(0, 8), headers=ARROW)
            table = app.state.core.table("t").table
            calls = _count(table, "check_batch_size")
            made = _count(table, "target")  # a pooled body's target is made (checked) once
            path = protocol.table_path("t", "sample")
            for _ in range(10):
                assert (await client.post(path, params={"batch_size": 4})).status_code == 200
            assert 1 <= len(made) <= 10
            assert len(calls) == 10 + len(made)  # one a call, and one per body made
            r = await client.post(protocol.table_path("t", "sample"), params={"batch_size": 99})
            assert r.status_code == 400 and r.json()["field"] == "batch_size"

    asyncio.run(main())


def test_a_door_placing_a_sample_gets_its_shape_and_a_checked_target(tmp_path: Path) -> None:
    """What the same-host door does with a slot: the core checks the batch size, gives the
    shape to lay the buffers out by, and a target made once serves every later call."""

    async def main() -> None:
        async with served(tmp_path) as (app, client):
            await client.post(protocol.TABLES, json=spec())
            await client.post(protocol.table_path("t", "extend"), content=body(0, 8), headers=ARROW)
            core = app.state.core
            calls = _count(core.table("t").table, "check_batch_size")
            made: list[Any] = []

            def place(shape: Shape) -> Any:
                if not made:
                    bufs = {
                        k: torch.empty([shape.rows, *s], dtype=d)
                        for k, (s, d) in shape.schema.items()
                    }
                    out = TensorDict({}, [shape.rows])
                    for key, t in bufs.items():
                        out[key] = t
                    assert shape.target is not None
                    made.append(shape.target(out))
                return made[0]

            for _ in range(3):
                drawn = core.sample_to("t", SampleParams(batch_size=4), place)
                assert isinstance(drawn, Shape)  # small, let through: drawn at once, no wait
            shape = drawn
            assert shape.rows == 4 and shape.owner is core.table("t") and shape.inline
            assert ("sample_info", "key") in shape.schema
            assert shape.item_nbytes == core.table("t").item_nbytes
            assert len(calls) == 1 + 1  # once for the size, and once when the target was made
            key = made[0].out["sample_info", "key"]
            assert torch.equal(key, made[0].out["id"] + 1)  # the rows landed in the buffers
            extend = core.extend_shape("t", BufferParams(rows=100))
            assert extend.rows == 64  # at most the capacity
            assert ("sample_info", "key") not in extend.schema and ("id",) in extend.schema

    asyncio.run(main())


def test_a_door_sample_held_back_is_awaited_and_checked_once(tmp_path: Path) -> None:
    """A sample the rate limiter holds back comes back as an awaitable (the door runs it
    as a task); it is drawn once rows arrive, its batch size checked once."""

    async def main() -> None:
        async with served(tmp_path) as (app, client):
            await client.post(protocol.TABLES, json=spec())
            core = app.state.core
            calls = _count(core.table("t").table, "check_batch_size")
            bufs: dict[Any, torch.Tensor] = {}

            def place(shape: Shape) -> Any:
                if not bufs:
                    out = TensorDict({}, [shape.rows])
                    for k, (s, d) in shape.schema.items():
                        out[k] = bufs.setdefault(k, torch.empty([shape.rows, *s], dtype=d))
                    assert shape.target is not None
                    bufs["target"] = shape.target(out)  # type: ignore[assignment]
                return bufs["target"]

            drawn = core.sample_to("t", SampleParams(batch_size=4, timeout=10), place)
            assert not isinstance(drawn, Shape)  # empty table: it must wait
            waiting = asyncio.ensure_future(drawn)  # type: ignore[arg-type]
            await asyncio.sleep(0.05)
            assert not waiting.done()
            r = await client.post(
                protocol.table_path("t", "extend"), content=body(0, 8), headers=ARROW
            )
            assert r.status_code == 200
            shape = await asyncio.wait_for(waiting, 10)
            assert shape.rows == 4 and len(calls) == 1 + 1  # the size once, the target once
            assert bool((bufs[("sample_info", "key")] >= 1).all())  # rows landed in the buffers

    asyncio.run(main())
