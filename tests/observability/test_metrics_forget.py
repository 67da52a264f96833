"""A deleted table leaves no series on ``/metrics``, on a real server.

Before, the request and rate-limiter series of a table outlived it when it was
deleted within a second of its creation (or always, for the rate limiter's):
one client creating, sampling and deleting tables of fresh names grew the
server's metrics by ~50 series a table, without bound.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from tensordict import TensorDict

from tdreplay.codec import encode, protocol

JSON = {"Content-Type": "application/json"}
TABLES = 20


def spec(name: str) -> bytes:
    fields = {"x": {"shape": [], "dtype": "float32"}}
    return json.dumps(
        {"name": name, "capacity": 4, "fields": fields, "backend": {"kind": "memory"}}
    ).encode()


def test_deleted_tables_leave_no_series(live_server: Any) -> None:
    server = live_server()
    row = encode(TensorDict({"x": torch.ones(1)}, batch_size=[1])).to_pybytes()
    for i in range(TABLES):
        name = f"churn{i}"
        assert server.request("POST", "/v1/tables", spec(name), JSON)[0] == 201
        # an empty table: the sample waits for the rate limiter and times out (429)
        sample = protocol.table_path(name, "sample") + "?batch_size=1&timeout=0"
        assert server.request("POST", sample)[0] == 429
        extend = protocol.table_path(name, "extend")
        assert (
            server.request("POST", extend, row, {"Content-Type": protocol.ARROW_STREAM})[0] == 200
        )
        assert server.request("POST", sample)[0] == 200
        assert server.request("DELETE", protocol.table_path(name))[0] == 204
    kept = server.request("POST", "/v1/tables", spec("kept"), JSON)
    assert kept[0] == 201
    assert (
        server.request("POST", protocol.table_path("kept", "sample") + "?batch_size=1&timeout=0")[0]
        == 429
    )
    status, _, body = server.request("GET", "/metrics")
    assert status == 200
    text = body.decode()
    left = [line for line in text.splitlines() if 'table="churn' in line]
    assert not left, f"{len(left)} series of deleted tables, e.g. {left[0]}"
    # a served table's series are still there
    assert 'tdreplay_rate_limiter_timeouts_total{op="sample",table="kept"} 1.0' in text
