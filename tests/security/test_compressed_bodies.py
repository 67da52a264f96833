"""An Arrow IPC body with compressed buffers is refused before anything is decompressed.

pyarrow's reader decompresses buffers (LZ4 or ZSTD) on its own, into memory it sizes
from the lengths the body declares. tdreplay never sends compressed bodies, and every
limit on what a client may make the server hold (``--max-body-bytes``,
``--max-receiving-bytes``) counts a body's bytes as they arrive: a 16 KiB ZSTD body
of zeros declared 512 MiB of rows, and the server took them (+529 MB of RSS) before any
check of the rows ran; a 1 MiB one declares ~32 GiB.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from testkit import REPO, free_port

from tdreplay.codec import CodecError, decode, protocol

MiB = 1 << 20
ROW = 64 * 1024  # bytes of x per row
ROWS = 8192  # 512 MiB of rows once decompressed


def rss(pid: int) -> int:
    """Resident bytes of process ``pid``, now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def request(port: int, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        kind = "application/json" if path == "/v1/tables" else protocol.ARROW_STREAM
        conn.request(method, path, body=body or None, headers={"Content-Type": kind})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


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
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, int]]:
    folder = tmp_path_factory.mktemp("compressed")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TDREPLAY_", "MALLOC_"))}
    argv = ["serve", "--host", "127.0.0.1", "--port", str(port), "--root", str(folder / "data")]
    argv += ["--log-level", "warning", "--max-receiving-bytes", str(8 * MiB)]
    with (folder / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tdreplay.service", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (folder / "server.log").read_text()
            try:
                if request(port, "GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the server never got ready"
            time.sleep(0.1)
        spec = {
            "name": "big",
            "capacity": ROWS,
            "fields": {"x": {"shape": [ROW], "dtype": "uint8"}},
            "backend": {"kind": "memory"},
        }
        assert request(port, "POST", "/v1/tables", json.dumps(spec).encode())[0] == 201
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_compressed_extend_is_refused_before_it_is_decompressed(
    server: tuple[subprocess.Popen, int],
) -> None:
    proc, port = server
    body = compressed(ROWS, "zstd")
    assert len(body) < 64 * 1024  # 512 MiB of rows
    base = rss(proc.pid)
    status, answer = request(port, "POST", protocol.table_path("big", "extend"), body)
    grown = rss(proc.pid) - base
    assert 400 <= status < 500, answer
    error = json.loads(answer)
    assert "compress" in error["detail"] and error["field"] == "body", error
    assert grown < 64 * MiB, grown / MiB
    info = json.loads(request(port, "GET", protocol.table_path("big"))[1])
    assert info["size"] == 0
