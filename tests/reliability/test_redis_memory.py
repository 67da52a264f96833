"""Redis memory follows a redis table's rows, under a real ``tdreplay serve``: a Redis out of
memory is a 507 that leaves the table serving what it holds, and a table restored on a
restart takes what its rows need.

Each test starts its own ``redis-server`` (:class:`RedisProcess`), without persistence.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import RedisProcess, call, check_rows, create, extend, size
from service_helpers import ARROW, assert_rows_match, body

from tdreplay.codec import decode, protocol

MiB = 1 << 20
CAPACITY = 1_000_000  # ~59 MB of rows at capacity


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A Redis started with 8 MB of memory at most and no eviction (``--maxmemory``)."""
    r = RedisProcess(tmp_path)
    r.start("--maxmemory", "8mb", "--maxmemory-policy", "noeviction")
    yield r
    r.stop()


def info(server: Any, name: str) -> dict[str, Any]:
    return json.loads(call(server, "GET", protocol.table_path(name)))


def test_a_redis_out_of_memory_is_a_507_and_the_table_keeps_serving(
    live_server: Callable[..., Any], small_redis: RedisProcess
) -> None:
    """A table of 59 MB at capacity on a Redis of 8 MB: made whole at create, it could not
    be created at all (Redis refused the allocation); now it takes rows until Redis is
    full, and the extend Redis refuses is a 507 naming the table, its Redis and the way
    out, with none of its rows taken."""
    server = live_server(redis=f"r={small_redis.url}")
    create(server, "full", capacity=CAPACITY, backend={"kind": "redis", "connection": "r"})
    item = info(server, "full")["item_nbytes"]
    acked, batch = 0, 16_384  # ~1 MB an extend
    while True:
        status, _, raw = server.request(
            "POST", protocol.table_path("full", "extend"), body=body(acked, batch), headers=ARROW
        )
        if status != 200:
            break
        acked += batch
        assert acked < CAPACITY // 4, "Redis never refused"
    err = json.loads(raw)
    assert (status, err["type"], err["table"]) == (507, "InsufficientStorage", "full"), err
    for detail in ("'full'", "'r'", "out of memory", "maxmemory", "preallocate"):
        assert detail in err["detail"], err["detail"]
    assert acked >= 3 * batch  # the rows went in until Redis was full
    assert size(server, "full") == acked
    check_rows(server, acked, name="full")  # only the rows acknowledged, each whole
    stats = info(server, "full")["stats"]
    assert stats["reserved_bytes"] == acked * item < stats["capacity_bytes"]
    assert server.request("GET", "/readyz")[0] == 200

    small_redis.client.config_set("maxmemory", 0)  # room again: the same insert goes in
    extend(server, acked, batch, name="full")
    check_rows(server, acked + batch, name="full")


def test_a_redis_table_restored_on_a_restart_takes_what_its_rows_need(
    live_server: Callable[..., Any], tmp_path: Path
) -> None:
    """A half-full redis table checkpointed on a stop and restored on the start: its rows
    are back, and Redis holds them, not the table's capacity."""
    r = RedisProcess(tmp_path / "redis")
    (tmp_path / "redis").mkdir()
    r.start()
    try:
        root = tmp_path / "data"
        flags: dict[str, Any] = {"redis": f"r={r.url}", "root": root}
        server = live_server("--checkpoint-on-shutdown", **flags)
        create(server, "half", capacity=CAPACITY, backend={"kind": "redis", "connection": "r"})
        extend(server, 0, 1000, name="half")
        server.stop()
        empty = int(r.client.info("memory")["used_memory"])
        server = live_server("--restore", **flags)
        check_rows(server, 1000, name="half")
        grown = int(r.client.info("memory")["used_memory"]) - empty
        assert grown < 2 * MiB, grown  # 1,000 rows of 59 B, not 59 MB
        extend(server, 1000, 1000, name="half")
        check_rows(server, 2000, name="half")
    finally:
        r.stop()


def test_a_wrapped_table_on_a_redis_over_maxmemory_is_a_507_and_keeps_serving(
    live_server: Callable[..., Any], tmp_path: Path
) -> None:
    """A full table overwrites rows it holds, which needs no more Redis memory, but a Redis
    over its ``maxmemory`` refuses every write (``SETRANGE``, ``INCR``) whatever it would
    allocate: the extend is a 507 naming the table and saying so, and the table keeps
    serving its rows. The first refused extend has evicted the items it was to overwrite;
    one retried meanwhile is refused before it evicts any (it took 8 more items a try).
    With room again, writes go in."""
    r = RedisProcess(tmp_path)
    r.start("--maxmemory-policy", "noeviction")
    try:
        server = live_server(redis=f"r={r.url}")
        create(server, "ring", capacity=64, backend={"kind": "redis", "connection": "r"})
        extend(server, 0, 64, name="ring")
        extend(server, 64, 16, name="ring")  # wrapped: rows 16..79
        r.client.config_set("maxmemory", 1)  # Redis is over it now
        for _ in range(3):
            status, _, raw = server.request(
                "POST", protocol.table_path("ring", "extend"), body=body(80, 8), headers=ARROW
            )
            err = json.loads(raw)
            assert (status, err["type"], err["table"]) == (507, "InsufficientStorage", "ring")
            for detail in ("'ring'", "'r'", "maxmemory", "every write", "overwriting"):
                assert detail in err["detail"], err["detail"]
            assert (info(server, "ring")["state"], size(server, "ring")) == ("ok", 56)
        path = protocol.table_path("ring", "sample") + "?batch_size=56"
        sampled = decode(call(server, "POST", path))
        assert int(sampled["id"].min()) >= 24 and int(sampled["id"].max()) < 80
        assert_rows_match(sampled)
        assert server.request("GET", "/readyz")[0] == 200

        r.client.config_set("maxmemory", 0)
        extend(server, 80, 8, name="ring")
        assert info(server, "ring")["state"] == "ok"
    finally:
        r.stop()
