"""A redis table's check of its Redis (marker and write count) beside its writes
(a real ``redis-server``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch
from tensordict import TensorDict

from tdreplay.storage import Table, TableSpec
from tdreplay.storage.backends.redis import RedisBackend


def test_a_check_beside_writes_never_finds_the_table_lost(
    redis_server: dict, tmp_path: Path
) -> None:
    """``info`` and ``/readyz`` probe the table's Redis without waiting for its writes: a
    probe that read the write count before a write was applied and compared it after the
    write was counted found the count behind, and made a healthy table ``lost`` for good."""
    spec = TableSpec.model_validate(
        {
            "name": "busy",
            "capacity": 1024,
            "backend": {"kind": "redis"},
            "fields": {"id": {"shape": [], "dtype": "int64"}},
        }
    )
    table = Table.create(spec, tmp_path, redis={"default": redis_server["url"]})
    backend = table.backend
    assert isinstance(backend, RedisBackend)
    stop = threading.Event()
    checks = 0

    def probe() -> None:
        nonlocal checks
        while not stop.is_set():
            backend.identity.check(force=True)
            checks += 1

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        deadline = time.monotonic() + 3
        start = 0
        while time.monotonic() < deadline and prober.is_alive():
            table.extend(TensorDict({"id": torch.arange(start, start + 8)}, [8]))
            start += 8
    finally:
        stop.set()
        prober.join(10)
        state = backend.state
        table.destroy()
    assert state == "ok" and checks > 100, (state, checks)
