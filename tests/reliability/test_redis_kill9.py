"""kill -9 of a server with a redis table: the keys it left in Redis are deleted, and only those.

A redis table's keys are recorded under the data root while they exist; a server killed
before it deleted them left them in Redis for good (every key of the table, its rows
included, after a restart with or without ``--restore`` and a delete of the table). Each
test runs its own ``redis-server`` and real ``tdreplay serve`` processes.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reliability_helpers import RedisProcess, call, create, extend, size

from tdreplay.codec import protocol

REDIS = {"kind": "redis", "connection": "r"}
#: keys tdreplay did not create: one under the table's own prefix, one elsewhere
FOREIGN = {b"tdreplay:rt:{00000000-0000-4000-8000-000000000000}:d:x": b"x", b"theirs": b"y"}


def keys(r: RedisProcess) -> set[bytes]:
    return set(r.client.keys("*"))


def records(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("tables/*/redis-*.json"))


def serve(live_server: Callable[..., Any], r: RedisProcess, root: Path, *args: str) -> Any:
    return live_server(*args, root=root, redis=f"r={r.url}", redis_timeout=1.0)


@pytest.mark.parametrize("restore", [False, True], ids=["plain", "restore"])
def test_a_killed_servers_keys_are_deleted_on_restart_and_no_others(
    live_server: Callable[..., Any], redis_proc: RedisProcess, tmp_path: Path, restore: bool
) -> None:
    redis_proc.client.mset(FOREIGN)
    root = tmp_path / "a"
    server = serve(live_server, redis_proc, root)
    create(server, "rt", backend=REDIS)
    extend(server, 0, 32, name="rt")
    json_body = {"body": b"{}", "headers": {"Content-Type": "application/json"}}
    call(server, "POST", protocol.table_path("rt", "checkpoint"), **json_body)
    killed = keys(redis_proc) - set(FOREIGN)
    _id(killed)  # one table's keys
    # another server's table of the same name, on the same Redis and prefix: not ours
    other = serve(live_server, redis_proc, tmp_path / "b")
    create(other, "rt", backend=REDIS)
    extend(other, 0, 8, name="rt")
    theirs = keys(redis_proc) - killed - set(FOREIGN)
    assert len(theirs) == len(killed)

    server.proc.kill()  # SIGKILL: the keys are not deleted
    server.proc.wait(10)
    assert killed <= keys(redis_proc)
    again = serve(live_server, redis_proc, root, *(["--restore"] if restore else []))
    assert set(FOREIGN) | theirs <= keys(redis_proc)
    mine = keys(redis_proc) - set(FOREIGN) - theirs
    assert mine.isdisjoint(killed), sorted(mine & killed)[:3]
    if restore:  # the checkpoint's rows, in keys of the restored table's own
        assert size(again, "rt") == 32
    else:
        assert mine == set()
        create(again, "rt", backend=REDIS)
        mine = keys(redis_proc) - set(FOREIGN) - theirs
    assert records(root) == [f"redis-{_id(mine)}.json"]
    assert again.request("DELETE", protocol.table_path("rt"))[0] == 204
    assert keys(redis_proc) == set(FOREIGN) | theirs
    assert records(root) == [] and not (root / "tables" / "rt").exists()
    assert size(other, "rt") == 8


def test_keys_a_hung_redis_kept_at_start_are_deleted_when_the_table_is_created(
    live_server: Callable[..., Any], redis_proc: RedisProcess, tmp_path: Path
) -> None:
    root = tmp_path / "a"
    server = serve(live_server, redis_proc, root)
    create(server, "rt", backend=REDIS)
    extend(server, 0, 32, name="rt")
    killed = keys(redis_proc)
    server.proc.kill()
    server.proc.wait(10)

    redis_proc.signal(signal.SIGSTOP)  # hung: the start does not wait on it past its timeout
    try:
        again = serve(live_server, redis_proc, root)
    finally:
        redis_proc.signal(signal.SIGCONT)
    assert keys(redis_proc) == killed  # kept, recorded still
    create(again, "rt", backend=REDIS)
    fresh = keys(redis_proc)
    assert fresh and fresh.isdisjoint(killed), sorted(fresh & killed)[:3]  # the old keys went
    assert "its record" in again.output()  # why they were kept at start
    assert records(root) == [f"redis-{_id(fresh)}.json"]
    status, _, raw = again.request("GET", protocol.table_path("rt"))
    assert status == 200 and json.loads(raw)["size"] == 0


def _id(table_keys: set[bytes]) -> str:
    """The ``TensorDictStore`` id of one table's keys (``<prefix>:{<id>}:...``)."""
    (found,) = {k.split(b"{")[1].split(b"}")[0].decode() for k in table_keys}
    return found
