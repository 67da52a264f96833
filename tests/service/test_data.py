"""Data over HTTP: extend, sample, stream and update_priority, every dtype bit-exact."""

from __future__ import annotations

import gc

import pyarrow as pa
import pytest
import torch
from service_helpers import ARROW, assert_rows_match, body, create, extend, info, rows, spec

from tdreplay.codec import decode, protocol, read_batches
from tdreplay.codec.ipc import SampleLayout
from tdreplay.service.wire import SampleBuffer, sample_schema

SAMPLE = protocol.table_path("t", "sample")
EXTEND = protocol.table_path("t", "extend")


def test_extend_answers_slots(service) -> None:
    client = service()
    create(client)
    r = extend(client, 0, 5)
    assert r.status_code == 200
    assert r.json() == {"index": [0, 1, 2, 3, 4], "rows": 5}
    assert r.headers[protocol.ROWS_WRITTEN] == "5"
    assert extend(client, 5, 3).json()["index"] == [5, 6, 7]


@pytest.mark.parametrize("n", [1, 7, 64])
def test_sample_round_trips_every_dtype(service, n: int) -> None:
    client = service()
    create(client, capacity=64)
    assert extend(client, 0, 40).status_code == 200
    r = client.post(SAMPLE, params={"batch_size": n})
    assert r.status_code == 200
    assert r.headers["content-type"] == protocol.ARROW_STREAM
    batch = decode(r.content)
    assert batch.batch_size == torch.Size([n])
    assert_rows_match(batch)
    assert torch.equal(batch["index"], batch["id"])  # slot i holds item i here
    assert batch["index"].dtype == torch.int64
    assert batch["sample_info", "priority"].dtype == torch.float32
    assert batch["sample_info", "weight"].dtype == torch.float32
    assert batch["sample_info", "times_sampled"].dtype == torch.int64
    assert (batch["sample_info", "weight"] == 1).all()
    assert (batch["sample_info", "times_sampled"] >= 1).all()


def test_sample_columns_are_flat_dotted_keys(service) -> None:
    client = service()
    create(client)
    extend(client, 0, 4)
    (rb,) = read_batches(client.post(SAMPLE, params={"batch_size": 2}).content)
    names = rb.schema.names
    assert "next.reward" in names and "sample_info.priority" in names and "index" in names
    assert rb.schema.field("action").metadata[b"tdreplay.dtype"] == b"bfloat16"


def test_sample_bodies_are_pooled(service) -> None:
    client = service(pooled_buffers=2)
    create(client)
    extend(client, 0, 16)
    handle = client.app.state.core.table("t")
    for _ in range(20):
        assert_rows_match(decode(client.post(SAMPLE, params={"batch_size": 8}).content))
    kept = handle.samples.pool._kept[8]
    assert 1 <= len(kept) <= 2
    gc.collect()
    free = handle.samples.pool.take(8)
    assert free is not None and any(free is b for b in kept)


def test_layout_template_gathers_into_wire_bytes() -> None:
    td = rows(0, 6)
    schema = {
        k if isinstance(k, tuple) else (k,): (list(v.shape[1:]), v.dtype)
        for k, v in td.items(True, True)
    }
    buf = SampleBuffer(SampleLayout(sample_schema(schema), 6))
    for key, value in td.items(True, True):
        buf.out.get(key).copy_(value)
    for key in ("index", ("sample_info", "times_sampled")):
        buf.out.get(key).copy_(torch.arange(6))
    lease = buf.lease()
    lease.finish()
    back = decode(lease.body)
    assert_rows_match(back)
    # the record-batch message alone, behind the schema message, reads as a stream too
    again = decode(buf.layout.header + bytes(lease.batch) + b"\xff\xff\xff\xff\x00\x00\x00\x00")
    assert torch.equal(again["id"], td["id"])
    # a bigger layout and a tiled run of 3 batches of 2 rows
    run = SampleLayout(sample_schema(schema), 2)
    sampled = rows(0, 6)
    sampled.update(
        {
            "index": torch.arange(6),
            "sample_info": {
                "priority": torch.ones(6),
                "weight": torch.ones(6),
                "times_sampled": torch.ones(6, dtype=torch.int64),
                "key": torch.arange(6),
            },
        }
    )
    tiled = run.tile(sampled, 3)
    reader = pa.ipc.open_stream(run.header + bytes(tiled) + b"\xff\xff\xff\xff\x00\x00\x00\x00")
    batches = list(reader)
    assert [b.num_rows for b in batches] == [2, 2, 2]
    from tdreplay.codec import from_record_batch

    for i, rb in enumerate(batches):
        part = from_record_batch(rb)
        assert_rows_match(part)
        assert part["id"].tolist() == [2 * i, 2 * i + 1]


@pytest.mark.parametrize(("batch_size", "count"), [(1, 50), (4, 7), (32, 3)])
def test_stream_sends_count_batches(service, batch_size: int, count: int) -> None:
    client = service(stream_chunk_bytes=4096)
    create(client)
    extend(client, 0, 40)
    with client.stream(
        "POST",
        protocol.table_path("t", "stream"),
        params={"batch_size": batch_size, "count": count},
    ) as r:
        assert r.status_code == 200
        data = r.read()
    batches = read_batches(data)
    assert len(batches) == count
    from tdreplay.codec import from_record_batch

    for rb in batches:
        assert rb.num_rows == batch_size
        assert_rows_match(from_record_batch(rb))
    assert info(client)["samples"] == batch_size * count


def test_stream_of_an_empty_table_is_429_before_it_starts(service) -> None:
    client = service()
    create(client)
    r = client.post(
        protocol.table_path("t", "stream"), params={"batch_size": 2, "count": 3, "timeout": 0}
    )
    assert r.status_code == 429
    assert r.json()["type"] == "EmptyTableError"  # a RateLimitTimeout: the table holds no item


def test_stream_ends_early_when_the_queue_runs_dry(service) -> None:
    client = service(stream_chunk_bytes=1)
    create(client, sampler={"kind": "fifo"})
    extend(client, 0, 5)
    r = client.post(
        protocol.table_path("t", "stream"), params={"batch_size": 2, "count": 10, "timeout": 0}
    )
    assert r.status_code == 200
    batches = read_batches(r.content)
    assert [b.num_rows for b in batches] == [2, 2]  # 5 items: two batches of 2, then dry


def test_update_priority(service) -> None:
    client = service()
    create(client, sampler={"kind": "prioritized", "alpha": 1.0, "beta": 1.0})
    extend(client, 0, 4)
    r = client.post(
        protocol.table_path("t", "update_priority"),
        json={"index": [0, 1, 2, 3], "priority": [0.0, 0.0, 5.0, 0.0]},
    )
    assert r.status_code == 200 and r.json() == {"updated": 4}
    batch = decode(client.post(SAMPLE, params={"batch_size": 16}).content)
    assert set(batch["index"].tolist()) == {2}
    assert torch.allclose(batch["sample_info", "priority"], torch.full((16,), 5.0), rtol=1e-3)


def test_update_priority_errors(service) -> None:
    client = service()
    create(client)
    extend(client, 0, 4)
    path = protocol.table_path("t", "update_priority")
    r = client.post(path, json={"index": [0], "priority": [1.0]})
    assert r.status_code == 400 and r.json()["type"] == "InvalidRequest"  # uniform: no priorities
    r = client.post(path, json={"index": [0, 1], "priority": [1.0]})
    assert r.status_code == 400 and r.json()["field"] == "priority"
    r = client.post(path, json={"index": [-1], "priority": [1.0]})
    assert r.status_code == 400


def test_update_priority_with_keys_skips_overwritten_slots(service) -> None:
    client = service()
    create(client, capacity=8, sampler={"kind": "prioritized", "alpha": 1.0, "beta": 1.0})
    extend(client, 0, 8)
    path = protocol.table_path("t", "update_priority")
    batch = decode(client.post(SAMPLE, params={"batch_size": 8}).content)
    index = batch["index"].tolist()
    key = batch["sample_info", "key"]
    assert key.dtype == torch.int64 and key.tolist() == (batch["id"] + 1).tolist()  # ordinals
    extend(client, 8, 8)  # every slot overwritten
    r = client.post(path, json={"index": index, "priority": [7.0] * 8, "key": key.tolist()})
    assert r.status_code == 200 and r.json() == {"updated": 0}
    after = decode(client.post(SAMPLE, params={"batch_size": 8}).content)
    assert (after["sample_info", "priority"] == 1.0).all()  # the new items are untouched
    # the new items' keys work; without keys the old behaviour (whatever the slot holds)
    fresh = after["sample_info", "key"].tolist()
    r = client.post(
        path, json={"index": after["index"].tolist(), "priority": [2.0] * 8, "key": fresh}
    )
    assert r.json() == {"updated": 8}
    r = client.post(path, json={"index": index, "priority": [3.0] * 8})
    assert r.status_code == 200 and r.json() == {"updated": 8}
    # the stream route carries the keys too (several batches tiled into one run)
    r = client.post(protocol.table_path("t", "stream"), params={"batch_size": 4, "count": 3})
    from tdreplay.codec import from_record_batch

    streamed = [from_record_batch(rb) for rb in read_batches(r.content)]
    assert len(streamed) == 3
    for part in streamed:
        assert torch.equal(part["sample_info", "key"], part["id"] + 1)


def test_update_priority_rejects_bad_keys(service) -> None:
    client = service()
    create(client, capacity=8, sampler={"kind": "prioritized", "alpha": 1.0})
    extend(client, 0, 8)
    path = protocol.table_path("t", "update_priority")
    r = client.post(path, json={"index": [0, 1], "priority": [5.0, 5.0], "key": [0]})
    assert r.status_code == 400
    assert r.json()["type"] == "InvalidRequest" and r.json()["field"] == "key"
    assert "2 indices but 1 keys" in r.json()["detail"]
    r = client.post(path, json={"index": [0], "priority": [5.0], "key": [-1]})
    assert r.status_code == 400 and r.json()["field"].startswith("key")
    batch = decode(client.post(SAMPLE, params={"batch_size": 8}).content)
    assert (batch["sample_info", "priority"] == 1.0).all()  # nothing changed


def test_stream_waits_for_the_reader(tmp_path) -> None:
    """Back-pressure: while the client does not take a batch, no further sample is drawn."""
    import asyncio

    from service_helpers import served

    async def main() -> None:
        async with served(tmp_path, stream_chunk_bytes=1) as (app, client):
            await client.post(protocol.TABLES, json=spec())
            await client.post(EXTEND, content=body(0, 8), headers=ARROW)
            table = app.state.core.table("t").table
            sent: list[dict] = []
            reader_stalls = asyncio.Event()
            hang_up = asyncio.Event()

            async def send(message: dict) -> None:
                sent.append(message)
                if len([m for m in sent if m.get("body")]) == 4:
                    reader_stalls.set()
                    # the client stops reading: send returns only once the client is gone
                    # (as uvicorn's does: it resumes a blocked send when the connection is lost)
                    await hang_up.wait()

            async def receive() -> dict:
                await hang_up.wait()
                return {"type": "http.disconnect"}

            scope = {
                "type": "http",
                "asgi": {"version": "3.0", "spec_version": "2.3"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": protocol.table_path("t", "stream"),
                "raw_path": protocol.table_path("t", "stream").encode(),
                "query_string": b"batch_size=2",
                "root_path": "",
                "headers": [],
                "client": ("127.0.0.1", 1),
                "server": ("127.0.0.1", 2),
            }
            task = asyncio.create_task(app(scope, receive, send))
            await reader_stalls.wait()
            drawn = table.rate_limiter.samples
            for _ in range(50):
                await asyncio.sleep(0)  # let any runaway producer run
            assert table.rate_limiter.samples == drawn
            # header + schema, then 3 batches went out (2 items each); at most the one in flight is drawn
            assert drawn <= 2 * 3
            hang_up.set()
            await asyncio.wait_for(task, 10)

    asyncio.run(main())


def test_stream_respects_max_times_sampled(service) -> None:
    """Items evicted after one draw never come back in a later batch of the stream."""
    client = service(stream_chunk_bytes=1 << 20)
    create(client, max_times_sampled=1)
    extend(client, 0, 40)
    r = client.post(
        protocol.table_path("t", "stream"), params={"batch_size": 2, "count": 8, "timeout": 0}
    )
    from tdreplay.codec import from_record_batch

    seen: set[int] = set()
    for rb in read_batches(r.content):
        ids = set(from_record_batch(rb)["id"].tolist())
        assert not ids & seen
        seen |= ids
