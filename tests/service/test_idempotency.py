"""X-Request-Id makes an extend idempotent: a repeat is answered from memory and inserts nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from service_helpers import ARROW, body, create, extend, info, served, spec, until

from tdreplay.codec import protocol
from tdreplay.codec.operations import INSERT
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


def test_an_id_sent_again_with_other_rows_is_refused(service) -> None:
    """A second extend under an id with another row count is no retry: refused, not answered
    with the first one's slots while its own rows vanish; the real retry still replays."""
    client = service()
    create(client)
    assert extend(client, 0, 3, **{RID: "reused"}).json()["index"] == [0, 1, 2]
    r = extend(client, 100, 5, **{RID: "reused"})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == RID and "3 rows" in r.json()["detail"], r.json()
    assert "5 rows" in r.json()["detail"]
    assert info(client)["size"] == 3 and info(client)["inserts"] == 3
    r = extend(client, 0, 3, **{RID: "reused"})
    assert r.headers[protocol.IDEMPOTENT_REPLAY] == "true" and r.json()["rows"] == 3


def test_an_id_sent_again_with_other_rows_of_the_same_count_is_refused(service) -> None:
    """Other rows of the same count under a used id are no retry either: they were answered
    with the first call's slots, and silently dropped."""
    client = service()
    create(client)
    assert extend(client, 0, 3, **{RID: "reused"}).json()["index"] == [0, 1, 2]
    r = extend(client, 50, 3, **{RID: "reused"})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == RID and "CRC-32" in r.json()["detail"], r.json()
    assert info(client)["size"] == 3 and info(client)["inserts"] == 3
    r = extend(client, 0, 3, **{RID: "reused"})  # the real retry still replays
    assert r.headers[protocol.IDEMPOTENT_REPLAY] == "true" and r.json()["index"] == [0, 1, 2]


def test_an_insert_id_sent_again_with_other_priorities_is_refused(service) -> None:
    client = service()
    create(client, "p", sampler={"kind": "prioritized"})

    def insert(priority: float, n: int = 2) -> Any:
        into = json.dumps({"p": priority})
        return client.post(
            INSERT.route,
            params={"into": into},
            content=body(0, n),
            headers={**ARROW, RID: "ins"},
        )

    assert insert(2.0).status_code == 200
    r = insert(9.0)
    assert r.status_code == 400 and r.json()["field"] == RID, r.text
    r = insert(2.0, n=3)
    assert r.status_code == 400 and r.json()["field"] == RID, r.text
    assert info(client, "p")["inserts"] == 2
    assert insert(2.0).headers[protocol.IDEMPOTENT_REPLAY] == "true"


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
            handle = app.state.core.table("t")
            headers = {**ARROW, RID: "dup"}
            assert (await client.post(EXTEND, content=body(0, 3), headers=ARROW)).status_code == 200
            first = asyncio.create_task(client.post(EXTEND, content=body(3, 2), headers=headers))
            await until(lambda: handle.table.rate_limiter.waiting["insert"] == 1)
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


def _answer(tag: str, nbytes: int):
    async def inner() -> tuple[str, bytes]:
        return tag, b"x" * nbytes

    return inner


def test_memory_is_bounded_in_bytes_oldest_first() -> None:
    recent = RecentRequests(size=1000, ttl=60, max_bytes=20_000)

    async def main() -> None:
        for i in range(40):  # ~1.4 kB each: about 14 fit
            await recent.run(f"id-{i}", _answer(f"a{i}", 1000))
            assert recent.nbytes <= recent.max_bytes
        kept = len(recent)
        assert 10 <= kept < 20
        assert await recent.run("id-39", _answer("again", 1)) == (("a39", b"x" * 1000), True)
        assert await recent.run("id-0", _answer("again", 1)) == (("again", b"x"), False)
        # the oldest went first: the newest ids are still remembered
        assert (await recent.run(f"id-{40 - kept + 2}", _answer("no", 1)))[1] is True

    asyncio.run(main())


def test_byte_count_is_what_is_held() -> None:
    """``nbytes`` matches the memory tracemalloc sees the entries take (ids, answers, bookkeeping)."""
    import tracemalloc

    recent = RecentRequests(size=100_000, ttl=60, max_bytes=1 << 30)

    async def main() -> int:
        async def answer() -> tuple[int, bytes]:
            return 100, json.dumps({"index": list(range(1000, 1100)), "rows": 100}).encode()

        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(5000):
                await recent.run(f"{i:08d}-0000-4000-8000-000000000000", answer)
            return tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()

    held = asyncio.run(main())
    assert 0.8 < recent.nbytes / held < 1.25, (recent.nbytes, held)


def test_failed_expired_and_oversized_answers_free_their_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("tdreplay.service.idempotency.time.monotonic", lambda: now[0])
    recent = RecentRequests(size=100, ttl=60, max_bytes=10_000)

    async def fail() -> None:
        raise ValueError("no")

    async def main() -> None:
        with pytest.raises(ValueError):
            await recent.run("f", fail)
        assert recent.nbytes == 0 and len(recent) == 0
        await recent.run("big", _answer("big", 20_000))  # alone over the bound
        assert recent.nbytes == 0 and len(recent) == 0
        await recent.run("small", _answer("small", 100))
        assert 0 < recent.nbytes < 1000
        now[0] += 61
        await recent.run("next", _answer("next", 100))
        assert len(recent) == 1 and recent.nbytes < 1000

    asyncio.run(main())


def test_extend_answers_are_kept_compactly(service) -> None:
    client = service()
    create(client, capacity=4096)
    recent = client.app.state.core.table("t").recent
    for i in range(40):
        assert extend(client, 100 * i, 100, **{RID: f"req-{i}"}).status_code == 200
    # 100 indices as JSON: ~6 bytes a row, not the 36 of a list of ints
    assert recent.nbytes / len(recent) < 1500
    assert (
        extend(client, 3900, 100, **{RID: "req-39"}).headers[protocol.IDEMPOTENT_REPLAY] == "true"
    )
