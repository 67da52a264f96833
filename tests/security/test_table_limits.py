"""The byte limits on tables, on a real server: bookkeeping counts, and the total is shared.

``--max-table-bytes`` bounds one table's rows plus its per-slot bookkeeping
(:func:`tdreplay.storage.sizing.table_nbytes`), so a table of tiny items cannot
slip past it; ``--max-total-bytes`` bounds all tables together (507), and a
table refused for it leaves the others serving.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.codec import decode, encode, protocol
from tdreplay.storage import TableSpec
from tdreplay.storage.sizing import table_nbytes

JSON = {"Content-Type": protocol.JSON}
ARROW = {"Content-Type": protocol.ARROW_STREAM}
GIB = 1 << 30
MAX_TOTAL = 3 << 20  # two of the 2 MB tables below fit alone, not together


def spec(name: str, capacity: int, fields: dict | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": capacity,
        "fields": fields or {"obs": {"shape": [4], "dtype": "float32"}},
        "backend": {"kind": "memory"},
        **extra,
    }


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    return live_server(max_table_bytes=GIB, max_total_bytes=MAX_TOTAL)


def create(server: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, _, raw = server.request("POST", protocol.TABLES, json.dumps(body).encode(), JSON)
    return status, json.loads(raw)


def names(server: Any) -> set[str]:
    status, _, raw = server.request("GET", protocol.TABLES)
    assert status == 200, raw
    return {t["name"] for t in json.loads(raw)["tables"]}


def serves(server: Any, name: str) -> None:
    """An extend and a sample of ``name`` succeed."""
    schema = TableSpec.model_validate(spec(name, 8)).torch_schema()
    rows = TensorDict(
        {k: torch.ones(4, *shape, dtype=dtype) for k, (shape, dtype) in schema.items()},
        batch_size=[4],
    )
    status, _, raw = server.request(
        "POST", protocol.table_path(name, "extend"), encode(rows).to_pybytes(), ARROW
    )
    assert status == 200, raw
    status, _, raw = server.request("POST", protocol.table_path(name, "sample") + "?batch_size=2")
    assert status == 200, raw
    assert decode(raw).batch_size[0] == 2


def test_bookkeeping_counts_against_max_table_bytes(server: Any) -> None:
    """300 M one-byte rows are 300 MB, under 1 GiB; with >= 18 bytes of bookkeeping per slot they are not."""
    body = spec(
        "tiny_items",
        300_000_000,
        {"done": {"shape": [], "dtype": "bool"}},
        sampler={"kind": "uniform"},
    )
    parsed = TableSpec.model_validate(body)
    assert parsed.capacity * parsed.item_nbytes < GIB  # the rows alone would fit
    assert table_nbytes(parsed) >= parsed.capacity * (1 + 18)
    status, answer = create(server, body)
    assert status == 422 and answer["type"] == "SchemaError", answer
    assert "--max-table-bytes" in answer["detail"] and str(GIB) in answer["detail"], answer
    assert answer["field"] == "capacity", answer
    assert str(table_nbytes(parsed)) in answer["detail"], answer
    assert "tiny_items" not in names(server)


@pytest.mark.parametrize("shape", [[0], [3, 0], [0, 5], [2, 0, 2]])
def test_zero_size_fields_are_refused(server: Any, shape: list[int]) -> None:
    body = spec(
        "empty",
        8,
        {"obs": {"shape": [2], "dtype": "float32"}, "z": {"shape": shape, "dtype": "uint8"}},
    )
    status, answer = create(server, body)
    assert status == 422 and answer["type"] == "SchemaError", answer
    assert "fields.z.shape" in str(answer.get("field")), answer
    assert "empty" not in names(server)


def test_max_total_bytes_is_shared_by_all_tables(server: Any) -> None:
    first, second = spec("first", 40_000), spec("second", 40_000)
    nbytes = table_nbytes(TableSpec.model_validate(first))
    assert nbytes <= MAX_TOTAL < 2 * nbytes  # each fits alone, not both
    status, answer = create(server, first)
    assert status == 201, answer
    status, answer = create(server, second)
    assert status == 507 and answer["type"] == "InsufficientStorage", answer
    assert "--max-total-bytes" in answer["detail"] and str(MAX_TOTAL) in answer["detail"], answer
    assert names(server) == {"first"}
    serves(server, "first")  # the first keeps serving
    status, _, raw = server.request("GET", protocol.table_path("first"))
    assert status == 200 and json.loads(raw)["size"] == 4, raw
    # a restore past the total is refused the same way
    status, _, raw = server.request("POST", protocol.table_path("first", "checkpoint"))
    assert status == 200, raw
    status, _, raw = server.request(
        "POST", protocol.table_path("first", "restore")
    )  # old + new held while it runs: 2 x nbytes > MAX_TOTAL
    assert status == 507 and json.loads(raw)["type"] == "InsufficientStorage", raw
    serves(server, "first")
    status, _, raw = server.request("DELETE", protocol.table_path("first"))
    assert status == 204, raw
    status, answer = create(server, second)
    assert status == 201, answer
    assert names(server) == {"second"}
    serves(server, "second")
    status, _, raw = server.request("DELETE", protocol.table_path("second"))
    assert status == 204, raw


def test_max_fields_bounds_what_one_schema_declares(live_server: Any) -> None:
    """``--max-fields``: a schema declaring more fields than the server takes is a 422 naming
    ``fields`` and creates nothing (100k fields took 6 s and bloated every listing)."""
    server = live_server(max_fields=3)
    many = {f"f{i}": {"shape": [], "dtype": "float32"} for i in range(4)}
    status, body = create(server, spec("wide", 8, many))
    assert status == 422, body
    assert body["field"] == "fields" and "--max-fields" in body["detail"], body
    assert names(server) == set()
    status, body = create(server, spec("narrow", 8, dict(list(many.items())[:3])))
    assert status == 201, body
    assert names(server) == {"narrow"}
