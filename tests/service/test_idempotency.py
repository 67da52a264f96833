"""X-Request-Id makes an extend idempotent: a repeat is answered from memory and inserts nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from service_helpers import ARROW, body, create, extend, info, served, spec, until

from tdreplay.codec import protocol
from tdreplay.service.idempotency import RecentRequests

RID = protocol.REQUEST_ID
EXTEND = protocol.table_path("t", "extend")


def test_repeat_is_answered_without_inserting(service) -> None:
    client = service()
    create(client)
    first = extend(client, 0, 3, **{RID: "a"})
    again = extend(client, 0, 3, **{RID: "a"})
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json() == {"index": [0, 1, 2], "rows": 3}
    assert protocol.IDEMPOTENT_REPLAY not in first.headers
    assert again.headers[protocol.IDEMPOTENT_REPLAY] == "true"
    assert again.headers[protocol.ROWS_WRITTEN] == "3"
    assert info(client)["inserts"] == 3
    assert extend(client, 3, 2, **{RID: "b"}).json()["index"] == [3, 4]
    assert extend(client, 5, 2).json()["index"] == [5, 6]  # no id: always inserts
    assert extend(client, 5, 2).json()["index"] == [7, 8]
    assert info(client)["inserts"] == 9


def test_ids_are_per_table(service) -> None:
    client = service()
    create(client, "t")
    create(client, "u")
    assert extend(client, 0, 2, "t", **{RID: "same"}).status_code == 200
    r = extend(client, 0, 2, "u", **{RID: "same"})
    assert protocol.IDEMPOTENT_REPLAY not in r.headers
    assert info(client, "u")["inserts"] == 2


def test_a_failed_request_is_forgotten(service) -> None:
    client = service()
    create(client)
    r = client.post(EXTEND, content=b"garbage", headers={**ARROW, RID: "x"})
    assert r.status_code == 400
    r = extend(client, 0, 2, **{RID: "x"})
    assert r.status_code == 200 and protocol.IDEMPOTENT_REPLAY not in r.headers
    assert info(client)["inserts"] == 2


def test_concurrent_duplicates_insert_once(tmp_path: Path) -> None:
    """A retry that arrives while the first attempt still waits on the rate limiter joins it."""
    limiter = {"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": 2}

    async def main() -> None:
        async with served(tmp_path) as (app, client):
            await client.post(protocol.TABLES, json=spec(rate_limiter=limiter))
            handle = app.state.registry.get("t")
            headers = {**ARROW, RID: "dup"}
            assert (await client.post(EXTEND, content=body(0, 3), headers=ARROW)).status_code == 200
            first = asyncio.create_task(client.post(EXTEND, content=body(3, 2), headers=headers))
            await until(lambda: handle.changes.waiting["insert"] == 1)
            second = asyncio.create_task(client.post(EXTEND, content=body(3, 2), headers=headers))
            await client.post(protocol.table_path("t", "sample"), params={"batch_size": 3})
            a, b = await asyncio.gather(first, second)
            assert a.json() == b.json() == {"index": [3, 4], "rows": 2}
            assert b.headers[protocol.IDEMPOTENT_REPLAY] == "true"
            assert handle.table.rate_limiter.inserts == 5

    asyncio.run(main())


def test_memory_is_bounded_and_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("tdreplay.service.idempotency.time.monotonic", lambda: now[0])
    recent = RecentRequests(size=2, ttl=60)
    calls: list[str] = []

    def call(tag: str):
        async def inner() -> str:
            calls.append(tag)
            return tag

        return inner

    async def main() -> None:
        for rid in ("a", "b", "c"):
            await recent.run(rid, call(rid))
        assert len(recent) == 2
        assert await recent.run("c", call("c2")) == ("c", True)
        assert await recent.run("a", call("a2")) == ("a2", False)  # evicted: runs again
        now[0] += 61
        assert await recent.run("c", call("c3")) == ("c3", False)  # expired: runs again

    asyncio.run(main())
    assert calls == ["a", "b", "c", "a2", "c3"]
