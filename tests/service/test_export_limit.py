"""Streamed exports under way at once are bounded (``--max-exports``).

A streamed export writes the whole table into a scratch file and keeps it until its
client has taken the answer. Before, nothing bounded them: every client that asked
for an export and read slowly (or not at all) held another table-size copy on the
server's disk. Past the limit an export is refused with a 503 ``BackendError`` and
``Retry-After``, before it copies anything; the slot comes back once an answer is
sent, or its client has gone.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

import torch

from tdreplay.client import ReplayClient
from tdreplay.codec import protocol

ROW = 256 * 1024  # float32 elements: 1 MiB a row
ROWS = 48  # 48 MiB of random floats: an answer the sockets' buffers cannot hold whole
EXPORT = protocol.table_path("big", "export")


def begin_export(server: Any) -> http.client.HTTPResponse:
    """A streamed export whose answer's head is read, its body not (yet)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
    conn.request("POST", EXPORT, body=b"{}", headers={"Content-Type": protocol.JSON})
    return conn.getresponse()


def scratch(root: Path) -> list[str]:
    folder = root / ".exports"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_exports_past_the_limit_are_refused_before_any_copy(live_server: Any) -> None:
    server = live_server(max_exports=2)
    spec = {
        "name": "big",
        "capacity": ROWS,
        "fields": {"x": {"shape": [ROW], "dtype": "float32"}},
        "backend": {"kind": "memory"},
    }
    with ReplayClient(server.url) as client:
        client.create_table(spec)
        for _ in range(ROWS // 8):
            client.extend("big", {"x": torch.rand(8, ROW)})

    held = [begin_export(server), begin_export(server)]
    assert [r.status for r in held] == [200, 200]
    assert len(scratch(server.root)) == 2  # each holds its copy until its client reads it
    status, headers, body = server.request(
        "POST", EXPORT, b"{}", {"Content-Type": protocol.JSON}, timeout=60
    )
    error = json.loads(body)
    assert status == 503 and headers.get("retry-after") == "5", (status, headers)
    assert error["type"] == "BackendError" and "--max-exports" in error["detail"], error
    assert len(scratch(server.root)) == 2  # the refused one copied nothing
    # an export written on the server counts too, and is refused before it writes
    status, _, body = server.request(
        "POST", EXPORT, json.dumps({"path": "exports/b.parquet"}).encode(),
        {"Content-Type": protocol.JSON}, timeout=60,
    )  # fmt: skip
    assert status == 503 and not (server.root / "exports" / "b.parquet").exists(), body

    whole = held[0].read()  # the first answer taken whole: its slot and copy are given back
    assert whole[:4] == b"PAR1" and int(held[0].headers[protocol.EXPORT_ROWS]) == ROWS
    held[0].close()
    held[1].close()  # the second's client goes midway: its slot and copy are given back too
    deadline = time.monotonic() + 30
    while scratch(server.root) and time.monotonic() < deadline:
        time.sleep(0.05)  # the server sees the second client gone on its next send
    assert scratch(server.root) == []
    again = [begin_export(server), begin_export(server)]
    assert [r.status for r in again] == [200, 200]
    for answer in again:
        assert answer.read()[:4] == b"PAR1"
        answer.close()
