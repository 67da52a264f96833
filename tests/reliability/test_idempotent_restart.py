"""A retried extend inserts once even when the server crashed in between (memmap tables).

The answer to an extend can be lost with the server: the rows are in the
table (acknowledged or not, a memmap write outlives ``kill -9``) but the
client saw the connection drop, and it sends the same request again, with
the same ``X-Request-Id``, to the restarted server. The server's memory of
request ids went with the process; the items' durable tags did not.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import torch
import yaml
from service_helpers import ARROW, FIELDS, body

from tdreplay.client import ReplayClient
from tdreplay.codec import protocol
from tdreplay.storage import Table, TableSpec


def _extend(server: Any, start: int, n: int, request_id: str) -> tuple[int, dict, dict]:
    status, headers, raw = server.request(
        "POST",
        protocol.table_path("t", "extend"),
        body(start, n),
        {**ARROW, protocol.REQUEST_ID: request_id},
    )
    return status, headers, json.loads(raw)


def test_a_retry_after_kill_9_is_answered_not_inserted(live_server: Any, tmp_path: Path) -> None:
    spec = {"name": "t", "capacity": 64, "fields": FIELDS}  # memmap: the default
    schema = tmp_path / "t.yaml"
    schema.write_text(yaml.safe_dump(spec))
    root = tmp_path / "data"
    server = live_server(schema=schema, root=root)
    first = [_extend(server, 8 * i, 8, f"req-{i}") for i in range(3)]
    assert all(status == 200 for status, _, _ in first)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)

    server = live_server(schema=schema, root=root)
    for i, (_, _, answer) in enumerate(first):  # the answers the crash "swallowed"
        status, headers, again = _extend(server, 8 * i, 8, f"req-{i}")
        assert status == 200
        assert headers.get(protocol.IDEMPOTENT_REPLAY.lower()) == "true"
        assert again["index"] == answer["index"]
    status, _, fresh = _extend(server, 100, 8, "req-new")  # a new id inserts as usual
    assert status == 200 and fresh["index"] == list(range(24, 32))
    client = ReplayClient(server.url)
    assert client.info("t")["size"] == 32
    server.stop()
    table = Table.open(TableSpec.model_validate(spec), root)
    try:
        ids = table.read(table.live_index())["id"]
        assert sorted(ids.tolist()) == list(range(24)) + list(range(100, 108))
    finally:
        table.close()


def test_after_kill_9_an_id_reused_for_other_rows_inserts_them(
    live_server: Any, tmp_path: Path
) -> None:
    """A tag names the id and the rows: after a restart, other rows of the same count under a
    used id are not taken for its retry (answered with its slots, their own rows dropped);
    the server no longer knows the id, so they insert as a new request."""
    spec = {"name": "t", "capacity": 64, "fields": FIELDS}
    schema = tmp_path / "t.yaml"
    schema.write_text(yaml.safe_dump(spec))
    root = tmp_path / "data"
    server = live_server(schema=schema, root=root)
    assert _extend(server, 0, 8, "req")[2]["index"] == list(range(8))
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)

    server = live_server(schema=schema, root=root)
    status, headers, answer = _extend(server, 100, 8, "req")
    assert status == 200 and protocol.IDEMPOTENT_REPLAY.lower() not in headers
    assert answer["index"] == list(range(8, 16))
    assert ReplayClient(server.url).info("t")["size"] == 16
    server.stop()


def test_tags_name_the_live_items_of_recent_inserts(tmp_path: Path) -> None:
    from service_helpers import rows

    spec = TableSpec.model_validate({"name": "t", "capacity": 10, "fields": FIELDS})
    table = Table.create(spec, tmp_path)
    try:
        table.extend(rows(0, 4), tag=11)
        table.extend(rows(4, 4), tag=22)
        table.extend(rows(8, 2))  # no tag
        assert {t: s.tolist() for t, s in table.tagged().items()} == {
            11: [0, 1, 2, 3],
            22: [4, 5, 6, 7],
        }
        table.extend(rows(10, 3), tag=33)  # the ring overwrites slots 0..2
        got = {t: s.tolist() for t, s in table.tagged().items()}
        assert got == {11: [3], 22: [4, 5, 6, 7], 33: [0, 1, 2]}
        assert list(table.tagged(limit=1)) == [33]  # the most recent first
    finally:
        table.close()
    reopened = Table.open(spec, tmp_path)  # durable: the tags come back with the items
    try:
        assert {t: s.tolist() for t, s in reopened.tagged().items()} == got
        assert torch.equal(reopened.tagged()[33], torch.tensor([0, 1, 2]))
    finally:
        reopened.close()
