"""A Redis that loses the data or hangs, under a real ``tdreplay serve``.

Each test starts its own ``redis-server`` without persistence (``--save ""
--appendonly no``), so killing and restarting it empties it, as a Redis
without persistence does after a crash; SIGSTOP makes it hang.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from reliability_helpers import RedisProcess, create, extend, state_until
from service_helpers import ARROW, body

from tdreplay.codec import decode, protocol

TIMEOUT = 1.0  # --redis-timeout of the servers here


def error(server: Any, method: str, path: str, **kw: Any) -> tuple[int, dict[str, Any], float]:
    """A call expected to fail: ``(status, JSON body, seconds it took)``."""
    start = time.monotonic()
    status, _, raw = server.request(method, path, **kw)
    took = time.monotonic() - start
    assert status >= 400, (status, raw[:300])
    return status, json.loads(raw), took


def sample(server: Any, name: str, n: int = 16) -> tuple[int, bytes]:
    status, _, raw = server.request(
        "POST", protocol.table_path(name, "sample") + f"?batch_size={n}"
    )
    return status, raw


def serve(live_server: Callable[..., Any], r: RedisProcess) -> Any:
    server = live_server(redis=f"r={r.url}", redis_timeout=TIMEOUT)
    create(server, "rt", backend={"kind": "redis", "connection": "r"})
    extend(server, 0, 32, name="rt")
    return server


def test_a_redis_restarted_empty_makes_the_table_lost_never_zeros(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    server = serve(live_server, redis_proc)
    status, raw = sample(server, "rt")
    assert status == 200 and decode(raw)["id"].max() < 32
    assert redis_proc.client.exists(*redis_proc.client.keys("*__tdreplay__"))

    redis_proc.kill()
    redis_proc.start()  # empty: no persistence
    # an extend first: it must not recreate the table's keys (zero-filled) in the empty Redis
    status, err, _ = error(
        server, "POST", protocol.table_path("rt", "extend"), body=body(32, 8), headers=ARROW
    )
    assert (status, err["type"]) == (503, "TableLost"), err
    assert redis_proc.client.dbsize() == 0
    for detail in ("'r'", redis_proc.url.removesuffix("0").rstrip("/"), "restore", "checkpoint"):
        assert detail.lower() in err["detail"].lower(), err["detail"]
    status, err, _ = error(server, "POST", protocol.table_path("rt", "sample") + "?batch_size=16")
    assert (status, err["type"]) == (503, "TableLost")

    info = json.loads(server.request("GET", protocol.table_path("rt"))[2])
    assert info["state"] == "lost"
    status, _, raw = server.request("GET", "/readyz")
    assert status == 503 and json.loads(raw)["lost"] == 1
    metrics = server.request("GET", "/metrics")[2].decode()
    assert 'tdreplay_table_lost{table="rt"} 1.0' in metrics

    # deleting the lost table and creating it again serves again
    assert server.request("DELETE", protocol.table_path("rt"))[0] == 204
    create(server, "rt", backend={"kind": "redis", "connection": "r"})
    extend(server, 0, 8, name="rt")
    status, raw = sample(server, "rt")
    assert status == 200 and decode(raw)["id"].max() < 8
    assert server.request("GET", "/readyz")[0] == 200


def test_a_redis_flushed_behind_the_server_is_noticed_on_the_next_sample(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    server = serve(live_server, redis_proc)
    redis_proc.client.flushall()
    time.sleep(1.05)  # reads check the marker at most once a second
    status, err, _ = error(server, "POST", protocol.table_path("rt", "sample") + "?batch_size=16")
    assert (status, err["type"]) == (503, "TableLost")


def test_a_hung_redis_fails_its_table_in_time_and_other_tables_keep_serving(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    server = serve(live_server, redis_proc)
    create(server, "mt")
    extend(server, 0, 32, name="mt")

    redis_proc.signal(signal.SIGSTOP)
    results: list[tuple[int, str, float]] = []

    def hung_call() -> None:
        status, err, took = error(
            server, "POST", protocol.table_path("rt", "sample") + "?batch_size=16"
        )
        results.append((status, err["type"], took))

    callers = [threading.Thread(target=hung_call) for _ in range(12)]  # more than REDIS_CALLS
    for t in callers:
        t.start()
    memory_took = []
    try:
        deadline = time.monotonic() + TIMEOUT * 1.5
        while time.monotonic() < deadline:
            start = time.monotonic()
            status, _ = sample(server, "mt")
            memory_took.append(time.monotonic() - start)
            assert status == 200
        for t in callers:
            t.join(15)
    finally:
        redis_proc.signal(signal.SIGCONT)
    assert max(memory_took) < 0.5, memory_took  # the memory table never waited on Redis
    assert len(results) == 12
    for status, kind, took in results:
        assert (status, kind) == (503, "BackendError")
        # TIMEOUT for a call, TIMEOUT more for one waiting its turn behind 4 hung ones
        assert took < 2 * TIMEOUT + 1.5, results
    status, raw = sample(server, "rt")  # continued: serves again
    assert status == 200 and decode(raw)["id"].max() < 32


def test_after_a_hang_the_table_serves_again(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    server = serve(live_server, redis_proc)
    redis_proc.signal(signal.SIGSTOP)
    try:
        status, err, took = error(
            server, "POST", protocol.table_path("rt", "sample") + "?batch_size=16"
        )
    finally:
        redis_proc.signal(signal.SIGCONT)
    assert (status, err["type"]) == (503, "BackendError")
    assert took < TIMEOUT + 1.5
    assert "'r'" in err["detail"] and f"{TIMEOUT:g}s" in err["detail"], err["detail"]
    status, raw = sample(server, "rt")
    assert status == 200 and decode(raw)["id"].max() < 32
    extend(server, 32, 8, name="rt")
    info = json.loads(server.request("GET", protocol.table_path("rt"))[2])
    assert (info["state"], info["size"]) == ("ok", 40)


def test_a_path_with_a_trailing_newline_reaches_no_route_and_forges_no_log_line(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    """A route's pattern ended in ``$``, which also matches before a final newline: ``POST
    .../extend%0A`` reached the extend route, and its failure (a 5xx, logged with the path)
    put a line break of the client's into the server's log."""
    server = serve(live_server, redis_proc)
    redis_proc.kill()  # the table's calls now fail with a 5xx, which the server logs
    extend_path = protocol.table_path("rt", "extend")
    status, err, _ = error(server, "POST", extend_path + "%0A", body=body(32, 8), headers=ARROW)
    assert (status, err["type"]) == (404, "InvalidRequest"), err
    status, err, _ = error(server, "POST", extend_path, body=body(32, 8), headers=ARROW)
    assert (status, err["type"]) == (503, "BackendError"), err
    lines = server.output().splitlines()
    assert any(line.endswith(f"POST {extend_path} failed: {err['detail']}") for line in lines)
    assert not [line for line in lines if line.startswith(" failed")], lines[-20:]


def ready_until(server: Any, status: int) -> dict[str, Any]:
    """``/readyz``'s body once it answers ``status`` (each Redis table's marker is probed at
    most once a second, a hung one's probe ends in the ``--redis-timeout``)."""
    deadline = time.monotonic() + 15
    while True:
        got, _, raw = server.request("GET", "/readyz")
        if got == status or time.monotonic() > deadline:
            assert got == status, raw
            return dict(json.loads(raw))
        time.sleep(0.1)


def test_a_server_whose_redis_is_unreachable_is_not_ready_until_it_answers(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    """A table whose Redis does not answer cannot serve: ``/readyz`` says 503 ``unreachable``
    (it said 200 ``ready``), liveness stays 200, and once Redis answers it is ready again."""
    server = serve(live_server, redis_proc)
    create(server, "mt")
    assert ready_until(server, 200)["status"] == "ready"
    redis_proc.signal(signal.SIGSTOP)
    try:
        body = ready_until(server, 503)
        assert server.request("GET", "/healthz")[0] == 200
    finally:
        redis_proc.signal(signal.SIGCONT)
    assert body == {"status": "unreachable", "tables": 2, "lost": 0, "unreachable": 1, "failed": 0}
    assert ready_until(server, 200)["unreachable"] == 0
    redis_proc.kill()  # down: refused at once
    assert ready_until(server, 503)["status"] == "unreachable"


def test_a_tables_info_says_unreachable_as_readyz_does(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    """A table's info said ``ok`` while its Redis was down (``/readyz``: 503 ``unreachable``):
    its state came from a test of its own, which knew only ``lost``. Both now ask the table
    one way, probing its Redis the same way."""
    server = serve(live_server, redis_proc)
    redis_proc.signal(signal.SIGSTOP)
    try:
        state_until(server, "unreachable")  # info alone finds it: no /readyz asked first
        assert ready_until(server, 503)["status"] == "unreachable"
        listed = json.loads(server.request("GET", protocol.TABLES)[2])["tables"]
        assert [t["state"] for t in listed if t["name"] == "rt"] == ["unreachable"]
    finally:
        redis_proc.signal(signal.SIGCONT)
    assert state_until(server, "ok")["size"] == 32
    redis_proc.kill()  # down: refused at once
    state_until(server, "unreachable")
    assert ready_until(server, 503)["status"] == "unreachable"


def test_a_delete_while_redis_is_down_is_a_503_and_keeps_the_table_and_its_keys(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    """A delete of a redis table whose Redis was down answered 500 ``InternalError`` (a
    ``ConnectionError`` out of deleting its keys) after the table had been dropped: its keys
    stayed in Redis for good, with no table left to delete them. Now Redis is asked first:
    a 503 naming it, the table served on; deleted once Redis answers, keys and all."""
    redis_proc.client.config_set("appendonly", "yes")  # the keys come back with Redis
    redis_proc.client.config_set("appendfsync", "always")
    server = serve(live_server, redis_proc)
    keys = sorted(redis_proc.client.keys("*"))
    redis_proc.kill()
    status, err, _ = error(server, "DELETE", protocol.table_path("rt"))
    assert (status, err["type"], err.get("table")) == (503, "BackendError", "rt"), err
    assert "'r'" in err["detail"] and "Connection refused" in err["detail"], err["detail"]

    redis_proc.start("--appendonly", "yes")
    assert sorted(redis_proc.client.keys("*")) == keys
    assert state_until(server, "ok")["size"] == 32  # still served, rows and all
    assert server.request("DELETE", protocol.table_path("rt"))[0] == 204
    assert redis_proc.client.dbsize() == 0


def test_a_restore_over_a_table_whose_redis_is_down_answers_what_it_did(
    live_server: Callable[..., Any], redis_proc: RedisProcess
) -> None:
    """A restore (here of a checkpoint of the table when it was a memory table) over a redis
    table whose Redis was down served the restored table, then failed deleting the old
    one's keys and answered 500: the client was told the restore failed, yet it had
    happened. It answers 200 now; the keys left in Redis are logged, named."""
    server = live_server(redis=f"r={redis_proc.url}", redis_timeout=TIMEOUT)
    create(server, "rt")  # memory
    extend(server, 0, 8, name="rt")
    path = json.dumps({"path": "checkpoints/snap/mem"}).encode()
    headers = {"Content-Type": "application/json"}
    got = server.request(
        "POST", protocol.table_path("rt", "checkpoint"), body=path, headers=headers
    )
    assert got[0] == 200, got[2]
    assert server.request("DELETE", protocol.table_path("rt"))[0] == 204
    create(server, "rt", backend={"kind": "redis", "connection": "r"})
    extend(server, 0, 32, name="rt")
    redis_proc.kill()
    status, _, raw = server.request(
        "POST", protocol.table_path("rt", "restore"), body=path, headers=headers
    )
    assert status == 200, raw[:300]
    info = json.loads(server.request("GET", protocol.table_path("rt"))[2])
    assert (info["backend"], info["size"]) == ("memory", 8)
    assert "tdreplay:rt:{" in server.output() and "replaced was left" in server.output()
