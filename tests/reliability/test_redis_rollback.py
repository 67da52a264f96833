"""A Redis that comes back from an older snapshot, under a real ``tdreplay serve``.

Each test starts its own ``redis-server`` (:class:`RedisProcess`), saves an RDB with
``SAVE``, has the server acknowledge more rows, kills Redis (no save on the way out) and
starts it again from that RDB: the table's marker is there, its rows are not (or older
ones are), so the table must say it lost them, not serve them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from reliability_helpers import RedisProcess, call, check_rows, create, extend, state_until
from service_helpers import ARROW, assert_rows_match, body

from tdreplay.codec import decode, protocol

TIMEOUT = 1.0  # --redis-timeout of the servers here
REDIS_TABLE = {"kind": "redis", "connection": "r"}


def roll_back(r: RedisProcess, server: Any, then: Callable[[], None]) -> None:
    """Save an RDB, ``then()`` (rows the server acknowledges), and restart Redis from it."""
    r.client.save()
    then()
    r.kill()  # SIGKILL: nothing saved since
    r.start()


def assert_lost(server: Any, r: RedisProcess, name: str = "rt") -> None:
    """The table says it lost its rows: its info's state, ``/readyz``, extend and sample."""
    state_until(server, "lost", name)  # info alone finds it (a probe at most once a second)
    status, _, raw = server.request("GET", "/readyz")
    assert status == 503 and json.loads(raw)["lost"] == 1, raw
    status, _, raw = server.request("POST", protocol.table_path(name, "sample") + "?batch_size=64")
    err = json.loads(raw)
    assert (status, err["type"], err["table"]) == (503, "TableLost", name), raw[:300]
    for detail in (f"{name!r}", "'r'", "older", "acknowledged", "restore", "checkpoint"):
        assert detail in err["detail"], err["detail"]
    keys_before = sorted(r.client.keys("*"))
    status, _, raw = server.request(
        "POST", protocol.table_path(name, "extend"), body=body(0, 8), headers=ARROW
    )
    assert (status, json.loads(raw)["type"]) == (503, "TableLost"), raw[:300]
    assert sorted(r.client.keys("*")) == keys_before  # the extend wrote nothing


def test_a_redis_back_from_an_older_snapshot_with_shorter_strings_is_lost(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    """Rows acknowledged after the RDB are past its strings' ends: samples failed with
    503s (``BackendError``, short reads) while info and ``/readyz`` said ``ok``. A restore
    from a checkpoint serves again."""
    server = live_server(redis=f"r={redis_proc.url}", redis_timeout=TIMEOUT)
    create(server, "rt", backend=REDIS_TABLE)
    extend(server, 0, 32, name="rt")
    call(server, "POST", protocol.table_path("rt", "checkpoint"))
    roll_back(redis_proc, server, lambda: extend(server, 32, 32, name="rt"))
    assert_lost(server, redis_proc)
    # the way back the error names: the checkpoint's rows, served again
    call(server, "POST", protocol.table_path("rt", "restore"))
    check_rows(server, 32, name="rt", batch=32)
    assert server.request("GET", "/readyz")[0] == 200


@pytest.mark.parametrize("preallocate", [False, True])
def test_a_redis_back_from_an_older_snapshot_with_old_rows_is_lost(
    live_server: Callable[..., Any], redis_proc: RedisProcess, preallocate: bool
) -> None:
    """Strings of full length holding older rows (the table wrapped after the RDB, or its
    strings were whole from create): the old rows were served as the new ones, silently."""
    server = live_server(redis=f"r={redis_proc.url}", redis_timeout=TIMEOUT)
    create(server, "rt", backend={**REDIS_TABLE, "preallocate": preallocate})
    extend(server, 0, 64, name="rt")  # full: its strings are whole
    roll_back(redis_proc, server, lambda: extend(server, 64, 64, name="rt"))  # wraps
    assert_lost(server, redis_proc)


def test_a_redis_restarted_with_every_acknowledged_row_keeps_serving(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    """No false alarm: a Redis whose snapshot holds every acknowledged write serves on."""
    server = live_server(redis=f"r={redis_proc.url}", redis_timeout=TIMEOUT)
    create(server, "rt", backend=REDIS_TABLE)
    extend(server, 0, 32, name="rt")
    roll_back(redis_proc, server, lambda: None)
    check_rows(server, 32, name="rt", batch=32)
    extend(server, 32, 40, name="rt")  # wraps
    info = json.loads(server.request("GET", protocol.table_path("rt"))[2])
    assert (info["state"], info["size"]) == ("ok", 64)
    assert server.request("GET", "/readyz")[0] == 200
    redis_proc.client.save()
    redis_proc.kill()
    redis_proc.start()
    raw = call(server, "POST", protocol.table_path("rt", "sample") + "?batch_size=64")
    sampled = decode(raw)
    assert int(sampled["id"].min()) >= 8 and int(sampled["id"].max()) < 72
    assert_rows_match(sampled)
