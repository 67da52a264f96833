"""Two requests racing for one server path: an export never replaces a file, a checkpoint
replaces only a checkpoint of its own table, however close together they come (a real
server; the second request's check runs while the first one's write is under way)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from tdreplay.codec import encode, protocol
from tdreplay.storage import checkpoint_table

#: rows of each table: large enough that its export / checkpoint takes a while (~64 MB)
ROWS, WIDTH = 4096, 4096


def _table(server: Any, name: str) -> None:
    """A memory table ``name`` of ROWS rows of WIDTH float32s, each row filled with ``id``."""
    spec = {
        "name": name,
        "capacity": ROWS,
        "backend": {"kind": "memory"},
        "fields": {
            "id": {"shape": [], "dtype": "int64"},
            "x": {"shape": [WIDTH], "dtype": "float32"},
        },
    }
    json_headers = {"Content-Type": "application/json"}
    status, _, raw = server.request(
        "POST", protocol.TABLES, json.dumps(spec).encode(), json_headers
    )
    assert status == 201, raw
    for start in range(0, ROWS, 512):
        ids = torch.arange(start, start + 512)
        batch = {"id": ids, "x": ids[:, None].float().expand(512, WIDTH).contiguous()}
        status, _, raw = server.request(
            "POST",
            protocol.table_path(name, "extend"),
            bytes(encode(batch)),
            {"Content-Type": protocol.ARROW_STREAM},
        )
        assert status == 200, raw


def _at_once(server: Any, calls: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[int, Any]]:
    """Send ``(table, operation, body)`` requests all at once; their ``(status, json)``."""
    barrier = threading.Barrier(len(calls))
    out: list[tuple[int, Any]] = [(0, None)] * len(calls)

    def one(i: int, name: str, op: str, body: dict[str, Any]) -> None:
        barrier.wait()
        status, _, raw = server.request(
            "POST",
            protocol.table_path(name, op),
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
            timeout=120,
        )
        out[i] = (status, json.loads(raw))

    threads = [threading.Thread(target=one, args=(i, *c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_two_exports_to_one_path_never_replace_each_other(
    live_server: Callable[..., Any],
) -> None:
    server = live_server()
    _table(server, "a")
    _table(server, "b")
    body = {"format": "parquet", "path": "exports/x.parquet"}
    results = _at_once(
        server, [("a", "export", body), ("b", "export", body), ("a", "export", body)]
    )
    statuses = sorted(s for s, _ in results)
    assert statuses == [200, 409, 409], results
    assert all(r["type"] == "PathExists" for s, r in results if s == 409), results
    winner = "ab"[[s for s, _ in results].index(200) % 2]
    written = pq.read_table(server.root / "exports" / "x.parquet")
    assert written.schema.metadata[b"tdreplay.table"].decode() == winner
    assert written.num_rows == ROWS
    leftover = [p.name for p in (server.root / "exports").iterdir() if p.name != "x.parquet"]
    assert not leftover  # no temporary file stays behind


def test_two_tables_checkpointing_to_one_new_path_do_not_replace_each_other(
    live_server: Callable[..., Any],
) -> None:
    server = live_server()
    _table(server, "a")
    _table(server, "b")
    body = {"path": "checkpoints/shared/x"}
    results = _at_once(server, [("a", "checkpoint", body), ("b", "checkpoint", body)])
    assert sorted(s for s, _ in results) == [200, 409], results
    (won,) = [name for name, (s, _) in zip("ab", results, strict=True) if s == 200]
    (lost,) = [r for s, r in results if s == 409]
    assert lost["type"] == "PathExists", lost
    target: Path = server.root / "checkpoints" / "shared" / "x"
    assert checkpoint_table(target) == won
    # the path is the winner's own now: it checkpoints there again, the other is refused
    again = _at_once(server, [(won, "checkpoint", body)])
    assert again[0][0] == 200, again
    other = "b" if won == "a" else "a"
    refused = _at_once(server, [(other, "checkpoint", body)])
    assert refused[0][0] == 409 and refused[0][1]["type"] == "PathExists", refused
    assert checkpoint_table(target) == won
    left = sorted(p.name for p in target.parent.iterdir())
    assert left == ["x"], left  # no aside or temporary copy stays behind
