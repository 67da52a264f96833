"""One insert, several tables (Reverb's insert with a priority per table): the same rows into
each named table with its own initial priority, every table checked before any is written,
each table's part atomic and idempotent on retry; and the TorchRL adapter's ``also=``."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
import torch
from test_shm import spec
from testkit import rows

from tdreplay.client import InvalidRequest, ReplayClient, SchemaError, TableNotFound
from tdreplay.client import commands as C
from tdreplay.codec import protocol
from tdreplay.torchrl import TDReplayBuffer

PRIORITIZED = {"kind": "prioritized", "alpha": 1.0, "beta": 0.0}


def _tables(client: ReplayClient, suffix: str) -> tuple[str, str]:
    hot, all_ = f"hot{suffix}", f"all{suffix}"
    client.create_table(spec(hot, PRIORITIZED, capacity=64))
    client.create_table(spec(all_, {"kind": "uniform"}, capacity=64))
    return hot, all_


def test_the_same_rows_go_into_each_table_with_its_own_priority(server: Any) -> None:
    client = ReplayClient(server.url)
    hot, all_ = _tables(client, "1")
    slots = client.extend({hot: 5.0, all_: None}, rows(0, 8))
    assert set(slots) == {hot, all_}
    assert slots[hot].tolist() == slots[all_].tolist() == list(range(8))
    for name in (hot, all_):
        assert client.info(name)["size"] == 8
        assert sorted(client.read(name, list(range(8)))["id"].tolist()) == list(range(8))
    batch = client.sample(hot, 16)
    assert torch.all(batch["sample_info", "priority"] == 5.0)
    client.extend({hot: 1.0}, rows(8, 8))  # one table is an insert too
    assert client.info(hot)["size"] == 16 and client.info(all_)["size"] == 8


def _post(server: Any, into: dict[str, Any], data: Any, request_id: str) -> tuple[int, Any]:
    body = b"".join(bytes(p) for p in C.rows_body(data))
    status, headers, answer = server.request(
        "POST", f"/v1/insert?into={quote(json.dumps(into))}", body,
        {"Content-Type": protocol.ARROW_STREAM, protocol.REQUEST_ID: request_id},
    )  # fmt: skip
    return status, (json.loads(answer), headers)


def test_a_retried_insert_writes_each_table_once(server: Any) -> None:
    client = ReplayClient(server.url)
    hot, all_ = _tables(client, "2")
    first, (answer, _) = _post(server, {hot: 2.0, all_: None}, rows(0, 4), "retry-me")
    again, (repeat, headers) = _post(server, {hot: 2.0, all_: None}, rows(0, 4), "retry-me")
    assert first == again == 200
    assert answer == repeat and headers.get("x-idempotent-replay") == "true"
    assert client.info(hot)["inserts"] == client.info(all_)["inserts"] == 4


@pytest.mark.parametrize(
    ("problem", "error"),
    [("missing", TableNotFound), ("schema", SchemaError), ("priority", InvalidRequest)],
)
def test_a_table_that_refuses_stops_the_insert_before_any_row_is_written(
    server: Any, problem: str, error: type[Exception]
) -> None:
    client = ReplayClient(server.url)
    hot, all_ = _tables(client, f"-{problem}")
    into: dict[str, float | None] = {hot: 1.0, all_: None}
    if problem == "missing":
        into["nowhere"] = None
    elif problem == "schema":
        other = spec(f"other-{problem}", {"kind": "uniform"}, capacity=64)
        other["fields"] = {"id": other["fields"]["id"]}
        client.create_table(other)
        into[other["name"]] = None
    else:
        into[all_] = 3.0  # a uniform table keeps no priorities
    with pytest.raises(error):
        client.extend(into, rows(0, 4))
    assert client.info(hot)["size"] == client.info(all_)["size"] == 0


def test_an_insert_names_one_to_sixteen_tables(server: Any) -> None:
    client = ReplayClient(server.url)
    with pytest.raises(InvalidRequest, match="1 to 16 tables"):
        client.extend({}, rows(0, 1))
    status, (answer, _) = _post(server, {f"t{i}": None for i in range(17)}, rows(0, 1), "x")
    assert status == 400 and answer["field"] == "into"
    status, (answer, _) = _post(server, {"n" * 65: None}, rows(0, 1), "y")  # as a route's name
    assert status == 400 and answer["field"].startswith("into.") and "64" in answer["detail"]


def test_the_torchrl_adapter_writes_its_also_tables_in_the_same_request(server: Any) -> None:
    client = ReplayClient(server.url)
    hot, all_ = _tables(client, "5")
    rb = TDReplayBuffer(server.url, all_, batch_size=4, also={hot: 4.0})
    index = rb.extend(rows(0, 6))
    assert index.tolist() == list(range(6))  # the buffer's own table's slots
    assert client.info(hot)["size"] == client.info(all_)["size"] == 6
    assert torch.all(client.sample(hot, 8)["sample_info", "priority"] == 4.0)
    import pickle

    clone = pickle.loads(pickle.dumps(rb))  # a collector worker's copy keeps also=
    clone.extend(rows(6, 2))
    assert client.info(hot)["size"] == 8


def test_the_answer_counts_the_rows_of_each_table(server: Any) -> None:
    """A max-value writer keeps only the largest items: its table takes fewer rows than
    the others, and the answer says how many each took (its retry too)."""
    client = ReplayClient(server.url)
    top = spec("top6", {"kind": "uniform"}, capacity=4, writer={"kind": "max_value", "key": "id"})
    client.create_table(top)
    client.create_table(spec("all6", {"kind": "uniform"}, capacity=64))
    into = {"top6": None, "all6": None}
    status, (answer, _) = _post(server, into, rows(10, 4), "counted")
    assert status == 200 and answer["rows"] == {"top6": 4, "all6": 4}
    status, (answer, _) = _post(server, into, rows(0, 3), "dropped")  # below top6's minimum
    assert status == 200 and answer["rows"] == {"top6": 0, "all6": 3}
    assert answer["index"]["top6"] == [-1, -1, -1]  # each row's slot; -1: dropped
    assert {k: sum(s >= 0 for s in v) for k, v in answer["index"].items()} == answer["rows"]
    again, (repeat, headers) = _post(server, into, rows(0, 3), "dropped")
    assert again == 200 and repeat == answer and headers.get("x-idempotent-replay") == "true"
    slots = client.extend(into, rows(100, 2))
    assert {k: len(v) for k, v in slots.items()} == {"top6": 2, "all6": 2}
    assert sorted(client.read("top6", list(range(4)))["id"].tolist()) == [12, 13, 100, 101]


def test_a_missing_table_is_answered_before_the_body_is_read(server: Any) -> None:
    """The core looks every table up before it reads the body: a request announcing a large
    body that never comes gets its 404 at once."""
    import socket

    client = ReplayClient(server.url)
    client.create_table(spec("here7", {"kind": "uniform"}, capacity=8))
    into = quote(json.dumps({"here7": None, "nowhere7": None}))
    head = (
        f"POST /v1/insert?into={into} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: {protocol.ARROW_STREAM}\r\nContent-Length: {100 << 20}\r\n\r\n"
    )
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(head.encode())
        answer = ""
        while "nowhere7" not in answer and (got := sock.recv(65536)):
            answer += got.decode(errors="replace")
    assert answer.startswith("HTTP/1.1 404"), answer[:200]
    assert "nowhere7" in answer and client.info("here7")["size"] == 0
