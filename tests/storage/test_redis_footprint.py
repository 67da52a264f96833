"""A redis table takes Redis memory as rows arrive, not its whole capacity at create
(a real ``redis-server``: its ``INFO memory`` ``used_memory``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from tensordict import TensorDict

from tdreplay.storage import Table, TableSpec

MiB = 1 << 20
ITEM = 1024  # bytes per item
CAPACITY = 64 * 1024  # 64 MiB at capacity


def spec(name: str, **backend: object) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": name,
            "capacity": CAPACITY,
            "backend": {"kind": "redis", **backend},
            "fields": {
                "id": {"shape": [], "dtype": "int64"},
                "pad": {"shape": [ITEM - 8], "dtype": "uint8"},
            },
        }
    )


def rows(start: int, n: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    pad = (ids % 251).to(torch.uint8)[:, None].expand(n, ITEM - 8).clone()
    return TensorDict({"id": ids, "pad": pad}, [n])


def used(redis_server: dict) -> int:
    return int(redis_server["client"].info("memory")["used_memory"])


def test_a_redis_table_takes_redis_memory_as_rows_come(redis_server: dict, tmp_path: Path) -> None:
    """``from_schema(storage="redis")`` sized every field's string to the capacity at create
    (``SETRANGE`` of its last byte: Redis zero-fills the rest): this empty 64 MiB table
    took 64 MiB of Redis memory, a 1M-row atari table 56 GB."""
    before = used(redis_server)
    table = Table.create(spec("lazy"), tmp_path, redis={"default": redis_server["url"]})
    try:
        assert used(redis_server) - before < MiB, "an empty table holds next to no Redis memory"
        assert table.info()["stats"]["reserved_bytes"] == 0
        n = CAPACITY // 8
        for start in range(0, n, 1024):
            table.extend(rows(start, 1024))
        grown = used(redis_server) - before
        # the rows written; a string's allocation rounds up by a quarter at most (jemalloc)
        assert n * ITEM <= grown < n * ITEM * 5 // 4 + 2 * MiB, grown / MiB
        assert table.info()["stats"]["reserved_bytes"] == n * ITEM
        got = table.read(torch.tensor([0, n - 1, n, CAPACITY - 1]))
        assert got["id"].tolist() == [0, n - 1, 0, 0]  # never written: zeros, as elsewhere
        assert bool((got["pad"][2:] == 0).all()) and int(got["pad"][1, 0]) == (n - 1) % 251
        batch = table.sample(256)
        assert int(batch["id"].max()) < n
        assert torch.equal(batch["pad"][:, 0], (batch["id"] % 251).to(torch.uint8))
    finally:
        table.destroy()
    assert used(redis_server) - before < MiB


@pytest.mark.parametrize("how", ["spec", "argument"])
def test_preallocate_reserves_the_capacity_at_create(
    redis_server: dict, tmp_path: Path, how: str
) -> None:
    """``backend.preallocate`` (or the server's ``--preallocate``) reserves it all at create."""
    before = used(redis_server)
    s = spec("whole", preallocate=True) if how == "spec" else spec("whole")
    table = Table.create(
        s, tmp_path, redis={"default": redis_server["url"]}, preallocate=how == "argument"
    )
    try:
        assert used(redis_server) - before >= CAPACITY * ITEM
        assert table.info()["stats"]["reserved_bytes"] == CAPACITY * ITEM
        table.extend(rows(0, 10))
        assert table.read(torch.tensor([9, CAPACITY - 1]))["id"].tolist() == [9, 0]
    finally:
        table.destroy()
    assert used(redis_server) - before < MiB


@pytest.mark.parametrize(
    ("parts", "held"),
    [
        ({}, list(range(300))),
        ({"sampler": {"kind": "fifo"}}, list(range(200, 550))),  # took the oldest 200
        ({"sampler": {"kind": "lifo"}}, [*range(100), *range(300, 550)]),  # the newest 200
    ],
    ids=["ring", "queue", "stack"],
)
def test_a_half_full_table_checkpoints_exports_and_restores(
    redis_server: dict, tmp_path: Path, parts: dict, held: list[int]
) -> None:
    """Every path that reads rows reads only rows written, so none reads past the end of a
    string that grows with them: a checkpoint and an export of a table far from full (a
    queue's or a stack's freed slots written again, out of slot order), its restore (which
    takes what its rows need), reads and samples."""
    url = {"default": redis_server["url"]}
    s = TableSpec.model_validate({**spec("half").model_dump(mode="json"), **parts})
    table = Table.create(s, tmp_path / "a", redis=url)
    restored = None
    try:
        table.extend(rows(0, 300))
        if parts:
            assert len(table.sample(200)["id"]) == 200  # taken: their slots are free again
            table.extend(rows(300, 250))
        live = table.live_index()
        want = table.read(live)
        assert sorted(want["id"].tolist()) == held
        assert bool((want["pad"][:, 0] == (want["id"] % 251).to(torch.uint8)).all())
        assert table.info()["stats"]["reserved_bytes"] < 600 * ITEM

        exported = pq.read_table(table.export(tmp_path / "out.parquet"))
        assert exported.column("id").to_pylist() == want["id"].tolist()  # oldest first
        before = used(redis_server)
        restored = Table.restore(
            table.checkpoint(tmp_path / "ckpt"), root=tmp_path / "b", redis=url
        )
        assert used(redis_server) - before < 2 * MiB  # its rows, not its 64 MiB of capacity
        assert restored.size == table.size
        again = restored.read(restored.live_index())
        assert torch.equal(again["id"], want["id"]) and torch.equal(again["pad"], want["pad"])
        restored.extend(rows(1000, 100))
        assert restored.size == table.size + 100
    finally:
        table.destroy()
        if restored is not None:
            restored.destroy()


def test_its_keys_are_tensordicts_own(redis_server: dict, tmp_path: Path) -> None:
    """The keys hold what ``from_schema`` writes (meta hash, keys registry, batch size), so
    ``TensorDictStore.from_store`` opens the table and reads the rows written by index."""
    from tensordict import TensorDictStore

    table = Table.create(spec("fmt"), tmp_path, redis={"default": redis_server["url"]})
    client = redis_server["client"]
    ref = TensorDict.from_schema(
        {"id": ([], torch.int64), "pad": ([ITEM - 8], torch.uint8)},
        batch_size=[CAPACITY],
        storage="redis",
        host=redis_server["host"],
        port=redis_server["port"],
        prefix="fmt-ref",
    )
    try:
        table.extend(rows(0, 10))
        store = table.backend.storage
        for field in ("id", "pad"):
            ours = client.hgetall(store._meta_key(field))
            theirs = client.hgetall(ref._meta_key(field))
            assert ours == theirs and ours  # the full shape and the dtype
        assert client.smembers(store._keys_registry_key) == {b"id", b"pad"}
        other = TensorDictStore.from_store(
            host=redis_server["host"],
            port=redis_server["port"],
            prefix=store._namespace,
            td_id=store._td_id,
        )
        try:
            assert other.batch_size == torch.Size([CAPACITY])
            assert other[0:10]["id"].tolist() == list(range(10))
            assert other[torch.tensor([7, 2])]["pad"][:, 0].tolist() == [7, 2]
        finally:
            other.close()
    finally:
        ref.clear_redis()
        ref.close()
        table.destroy()
