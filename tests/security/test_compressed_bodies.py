"""An Arrow IPC body with compressed buffers is refused before anything is decompressed.

pyarrow's reader decompresses buffers (LZ4 or ZSTD) on its own, into memory it sizes
from the lengths the body declares. tdreplay never sends compressed bodies, and every
limit on what a client may make the server hold (``--max-body-bytes``,
``--max-receiving-bytes``) counts a body's bytes as they arrive: a 16 KiB ZSTD body
of zeros declared 512 MiB of rows, and the server took them (+529 MB of RSS) before any
check of the rows ran; a 1 MiB one declares ~32 GiB.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from testkit import rss

from tdreplay.codec import CodecError, decode, protocol

MiB = 1 << 20
ROW = 64 * 1024  # bytes of x per row
ROWS = 8192  # 512 MiB of rows once decompressed


def request(server: Any, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    kind = "application/json" if path == "/v1/tables" else protocol.ARROW_STREAM
    status, _, answer = server.request(
        method, path, body or None, {"Content-Type": kind}, timeout=60
    )
    return status, answer


def compressed(rows: int, codec: str) -> bytes:
    """An Arrow IPC stream of ``rows`` zero rows of x, its buffers compressed with ``codec``."""
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(ROW * rows, dtype=np.uint8)), ROW)
    batch = pa.record_batch([x], names=["x"])
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_the_codec_refuses_compressed_buffers(codec: str) -> None:
    with pytest.raises(CodecError, match="compress"):
        decode(compressed(4, codec))


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    server = live_server(fresh=True, max_receiving_bytes=8 * MiB)  # RSS is measured
    spec = {
        "name": "big",
        "capacity": ROWS,
        "fields": {"x": {"shape": [ROW], "dtype": "uint8"}},
        "backend": {"kind": "memory"},
    }
    assert request(server, "POST", "/v1/tables", json.dumps(spec).encode())[0] == 201
    return server


def test_a_compressed_extend_is_refused_before_it_is_decompressed(server: Any) -> None:
    body = compressed(ROWS, "zstd")
    assert len(body) < 64 * 1024  # 512 MiB of rows
    base = rss(server.proc.pid)
    status, answer = request(server, "POST", protocol.table_path("big", "extend"), body)
    grown = rss(server.proc.pid) - base
    assert 400 <= status < 500, answer
    error = json.loads(answer)
    assert "compress" in error["detail"] and error["field"] == "body", error
    assert grown < 64 * MiB, grown / MiB
    info = json.loads(request(server, "GET", protocol.table_path("big"))[1])
    assert info["size"] == 0
