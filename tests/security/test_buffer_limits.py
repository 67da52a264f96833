"""The memory a server keeps between requests is bounded: ``--pooled-bytes``, on a real server.

A sample's body, and the layout it is copied from, are kept for reuse by batch
size. Before ``--pooled-bytes``, sequential samples of sixteen batch sizes from
one client left the server holding two bodies' worth of memory per size, per
table, for as long as the table lived (3.4 GB per table of 1 MiB items).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from tensordict import TensorDict
from testkit import rss

from tdreplay.codec import decode, encode, protocol

ITEM = 192 << 10  # bytes of one row
SIZES = range(100, 116)  # batch sizes: ~20 MB bodies, 16 of them
POOLED = 16 << 20
MiB = 1 << 20


def test_sample_buffers_kept_are_bounded_by_pooled_bytes(live_server: Any) -> None:
    # big arrays are mmapped, so what the server frees leaves its RSS at once (in a fresh
    # process: a MALLOC_MMAP_THRESHOLD_ in the environment would win over the flag)
    server = live_server(fresh=True, pooled_bytes=POOLED, malloc_mmap_threshold=MiB)
    spec = {
        "name": "big",
        "capacity": 128,
        "fields": {"x": {"shape": [ITEM], "dtype": "uint8"}},
        "backend": {"kind": "memory"},
    }
    json_body = json.dumps(spec).encode()
    status, _, body = server.request(
        "POST", "/v1/tables", json_body, {"Content-Type": "application/json"}
    )
    assert status == 201, body
    row = TensorDict({"x": torch.full((1, ITEM), 7, dtype=torch.uint8)}, batch_size=[1])
    status, _, body = server.request(
        "POST",
        protocol.table_path("big", "extend"),
        encode(row).to_pybytes(),
        {"Content-Type": protocol.ARROW_STREAM},
    )
    assert status == 200, body
    sample = protocol.table_path("big", "sample")
    status, _, _ = server.request("POST", f"{sample}?batch_size=1")
    assert status == 200
    before = rss(server.proc.pid)
    for n in SIZES:
        status, _, body = server.request("POST", f"{sample}?batch_size={n}")
        assert status == 200, body[:300]
        batch = decode(body)
        assert batch.batch_size[0] == n and int(batch["x"][-1, -1]) == 7
        del body, batch
    grown = rss(server.proc.pid) - before
    # unbounded: ~16 x 2 x 20 MB = 660 MB kept; bounded: the budget and what is in flight
    assert grown < 200 * MiB, f"the server kept {grown / MiB:.0f} MiB past --pooled-bytes"
    status, _, body = server.request("POST", f"{sample}?batch_size={SIZES[0]}")
    assert status == 200 and decode(body).batch_size[0] == SIZES[0]
