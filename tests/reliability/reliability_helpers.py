"""HTTP helpers on a :class:`LiveServer` (tests/conftest.py): a table, its rows, its size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from service_helpers import ARROW, assert_rows_match, body, spec

from tdreplay.codec import decode, protocol


def call(server: Any, method: str, path: str, **kw: Any) -> Any:
    status, _, raw = server.request(method, path, **kw)
    assert status < 300, (status, raw[:500], server.output()[-2000:])
    return raw


def create(server: Any, name: str = "t", capacity: int = 64, **extra: Any) -> None:
    payload = json.dumps(spec(name, capacity, **extra)).encode()
    call(
        server, "POST", protocol.TABLES, body=payload, headers={"Content-Type": "application/json"}
    )


def extend(server: Any, start: int, n: int, name: str = "t") -> None:
    call(server, "POST", protocol.table_path(name, "extend"), body=body(start, n), headers=ARROW)


def size(server: Any, name: str = "t") -> int:
    return json.loads(call(server, "GET", protocol.table_path(name)))["size"]


def names(server: Any) -> list[str]:
    return sorted(t["name"] for t in json.loads(call(server, "GET", protocol.TABLES))["tables"])


def check_rows(server: Any, n: int, name: str = "t", batch: int = 256) -> None:
    """The table holds rows 0..n-1 of service_helpers.rows, bit for bit."""
    assert size(server, name) == n
    raw = call(server, "POST", protocol.table_path(name, "sample") + f"?batch_size={batch}")
    sampled = decode(raw)
    assert int(sampled["id"].max()) < n
    assert_rows_match(sampled)


def env() -> dict[str, str]:
    """The test environment less its ``TDREPLAY_*`` variables (as ``live_server`` does)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TDREPLAY_")}


def python(*args: str) -> subprocess.Popen:
    """``python *args`` with stdout and stderr together, as text."""
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(),
    )
