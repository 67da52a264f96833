"""Create-if-absent under a race: processes creating one table at once all succeed.

Before it was one server operation, the loser of a race got ``TableExists``
(the winner's create was under way), swallowed it, and then found no table
(404) - one collector worker in two died of it.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.client import ReplayClient, TableExists

FIELDS = {"x": {"shape": [64], "dtype": "float32"}, "id": {"shape": [], "dtype": "int64"}}
WORKERS, TRIALS = 3, 5


def spec(name: str, capacity: int = 1 << 16) -> dict[str, Any]:
    # memmap (17 MB of rows): its create takes a moment, the others arrive meanwhile
    return {"name": name, "capacity": capacity, "fields": FIELDS}


def creator(url: str, worker: int, barrier: Any, out: Any) -> None:
    client = ReplayClient(url, transport="http")
    for trial in range(TRIALS):
        name = f"race{trial}"
        barrier.wait()
        try:
            client.create_table(spec(name), if_absent=True)
            ids = torch.arange(worker * 8, worker * 8 + 8)
            client.extend(name, TensorDict({"x": torch.zeros(8, 64), "id": ids}, [8]))
            out.put((trial, worker, "ok"))
        except Exception as err:  # reported, not raised: the test names it
            out.put((trial, worker, f"{type(err).__name__}: {err}"))


def test_concurrent_creators_with_one_spec_all_succeed(server: Any) -> None:
    ctx = mp.get_context("spawn")  # fresh interpreters: no thread of this process forked
    barrier, out = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [
        ctx.Process(target=creator, args=(server.url, w, barrier, out)) for w in range(WORKERS)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in range(WORKERS * TRIALS)]
    for p in procs:
        p.join(30)
    failed = [r for r in results if r[2] != "ok"]
    assert not failed, failed
    client = ReplayClient(server.url, transport="http")
    for trial in range(TRIALS):
        info = client.info(f"race{trial}")
        assert info["size"] == info["inserts"] == 8 * WORKERS
    with pytest.raises(TableExists, match=r"capacity: 65536 on the server, 2048 asked"):
        client.create_table(spec("race0", capacity=2048), if_absent=True)
    for trial in range(TRIALS):
        client.delete_table(f"race{trial}")
