"""A full ``/dev/shm`` under a real ``tdreplay serve`` with a ``shared`` table: 507 and a
message, never SIGBUS; ``clear`` gives the shared memory back.

The server runs in a mount namespace of its own whose ``/dev/shm`` is an 8 MiB tmpfs
(``unshare -m``, ``mount -t tmpfs``: needs root or CAP_SYS_ADMIN; skipped with the
reason where it is refused). Its loopback is the host's: the test talks to it as usual.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
import torch
from service_helpers import ARROW
from tensordict import TensorDict

from tdreplay.codec import encode, protocol

ITEM = 4096  # x: 1024 float32
MiB = 1 << 20

#: runs the command appended to it in a mount namespace of its own whose /dev/shm is 8 MiB
SMALL_SHM = ["-m", "sh", "-c", "mount --make-rprivate / && "
             'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$@"', "sh"]  # fmt: skip


@pytest.fixture
def small_shm_server(live_server: Any) -> Any:
    """``tdreplay serve`` under a small ``/dev/shm`` of its own, with automatic garbage
    collection off: what a ``clear`` gives back comes back at once, not whenever the
    collector next runs (a 507's traceback had kept the old table's segments until then,
    so room came back or not by the collector's timing)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here")
    wrap = [unshare, *SMALL_SHM]
    tried = subprocess.run([*wrap, "true"], capture_output=True, text=True, timeout=30)
    if tried.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs on /dev/shm here: {tried.stderr.strip()}")
    return live_server(fresh=True, gc=False, wrap=wrap)


def call(server: Any, path: str, body: Any = None, **headers: str) -> tuple[int, Any]:
    """GET ``path``, or POST ``body`` (JSON unless already bytes); the answer, decoded."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = headers or {"Content-Type": "application/json"}
    post = body is not None or path.endswith("/clear")
    status, _, raw = server.request("POST" if post else "GET", path, data, hdrs)
    return status, json.loads(raw) if raw[:1] == b"{" else raw


def extend(server: Any, name: str, start: int, n: int) -> tuple[int, Any]:
    x = torch.arange(start, start + n, dtype=torch.float32)[:, None].expand(n, 1024)
    body = encode(TensorDict({"x": x.contiguous()}, [n])).to_pybytes()
    return call(server, protocol.table_path(name, "extend"), body, **ARROW)


def table_spec(name: str, capacity: int, **backend: Any) -> dict[str, Any]:
    return {"name": name, "capacity": capacity, "fields": {"x": {"shape": [1024],
            "dtype": "float32"}}, "backend": {"kind": "shared", **backend}}  # fmt: skip


def test_a_full_dev_shm_is_a_507_before_any_row_lands_and_clear_gives_it_back(
    small_shm_server: Any,
) -> None:
    """A shared table 4x the server's ``/dev/shm`` was refused at create; it is created
    with none of it taken, takes rows until ``/dev/shm`` is full - then answers 507 naming
    shared memory with no row of that extend landed, serves what it holds, and the server
    lives on (a write into a page ``/dev/shm`` had no room for would SIGBUS it). ``clear``
    gives the rows' shared memory back (``reserved_bytes`` 0), and rows come again.
    With ``preallocate`` such a table is a 507 at create."""
    server = small_shm_server
    capacity = 4 * 8 * MiB // ITEM  # 32 MiB of rows
    status, info = call(server, protocol.TABLES, table_spec("big", capacity))
    assert status == 201, info
    assert info["stats"]["reserved_bytes"] == 0, info["stats"]
    acked = 0
    while acked < capacity:
        status, err = extend(server, "big", acked, 128)
        if status != 200:
            break
        acked += 128
    assert (status, err.get("type")) == (507, "InsufficientStorage"), err
    assert "shared memory" in err["detail"] and "--shm-size" in err["detail"], err["detail"]
    assert 5 * MiB <= acked * ITEM <= 8 * MiB, acked  # the 8 MiB filled, no more
    status, info = call(server, protocol.table_path("big"))
    assert info["size"] == acked and info["inserts"] == acked, info  # nothing of the 507
    assert acked * ITEM <= info["stats"]["reserved_bytes"] <= 8 * MiB, info["stats"]
    status, _, raw = server.request("POST", protocol.table_path("big", "sample") + "?batch_size=64")
    assert status == 200, raw[:300]
    status, info = call(server, protocol.table_path("big", "clear"))
    assert status == 200 and info["size"] == 0, info
    assert info["stats"]["reserved_bytes"] == 0, info["stats"]
    assert extend(server, "big", 0, 1024)[0] == 200  # 4 MiB: room again
    status, err = call(server, protocol.TABLES, table_spec("pre", capacity, preallocate=True))
    assert (status, err.get("type")) == (507, "InsufficientStorage"), err
    assert server.proc.poll() is None and server.request("GET", "/healthz")[0] == 200
    assert "Bus error" not in server.output()
