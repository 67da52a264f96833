"""The transport-neutral core, called in process (no HTTP): the operations every door uses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from service_helpers import rows, spec

from tdreplay.codec import decode
from tdreplay.codec.params import (
    ExportBody,
    ExtendParams,
    InsertParams,
    PathBody,
    PriorityUpdate,
    SampleParams,
    StreamParams,
    parse,
)
from tdreplay.service import Settings
from tdreplay.service.core import Core
from tdreplay.storage import (
    BackendError,
    InvalidRequest,
    PathExists,
    RateLimitTimeout,
    TableNotFound,
    TableSpec,
)


def columns(start: int, n: int) -> dict[tuple[str, ...], torch.Tensor]:
    td = rows(start, n)
    return {k if isinstance(k, tuple) else (k,): v for k, v in td.items(True, True)}


def run(coro):
    return asyncio.run(coro)


def test_the_operations_in_process(tmp_path: Path) -> None:
    async def main() -> None:
        core = Core(Settings(root=tmp_path, torch_threads=0))
        try:
            await core.create(
                TableSpec.model_validate(spec(sampler={"kind": "prioritized", "alpha": 1.0}))
            )
            index, replayed = await core.extend("t", columns(0, 8), ExtendParams())
            assert index.tolist() == list(range(8)) and not replayed
            again, replayed = await core.extend(
                "t", columns(0, 8), parse(ExtendParams, {"X-Request-Id": "r1"})
            )
            repeat, replayed2 = await core.extend(
                "t", columns(0, 8), parse(ExtendParams, {"X-Request-Id": "r1"})
            )
            assert repeat.tolist() == again.tolist() and (replayed, replayed2) == (False, True)
            lease = await core.sample("t", SampleParams(batch_size=4))
            batch = decode(lease.body)
            assert batch["id"].shape == (4,) and set(batch.keys()) >= {"index", "sample_info"}
            update = PriorityUpdate(index=batch["index"].tolist(), priority=[5.0] * 4)
            assert await core.update_priority("t", update) == 4
            header, batches = await core.stream("t", StreamParams(batch_size=2, count=3))
            assert header and sum([1 async for _ in batches]) >= 1
            info = await core.info("t")
            assert info["size"] == 16 and info["inserts"] == 16
            path = await core.checkpoint("t", PathBody())
            assert path == "checkpoints/t"
            with pytest.raises(InvalidRequest):
                await core.checkpoint("t", PathBody(path="../elsewhere"))
            written, scratch = await core.export("t", ExportBody(path="exports/t.parquet"))
            assert written.is_file() and not scratch
            with pytest.raises(PathExists):
                await core.export("t", ExportBody(path="exports/t.parquet"))
            restored = await core.restore("t", PathBody())
            assert restored["size"] == 16
            await core.delete("t")
            with pytest.raises(TableNotFound):
                await core.info("t")
        finally:
            await core.close()

    run(main())


def test_a_waiting_sample_counts_one_wait_however_often_it_is_woken(tmp_path: Path) -> None:
    async def main() -> None:
        core = Core(Settings(root=tmp_path, torch_threads=0))
        try:
            await core.create(
                TableSpec.model_validate(spec(rate_limiter={"min_size_to_sample": 6}))
            )
            waiter = asyncio.create_task(core.sample("t", SampleParams(batch_size=2, timeout=30)))
            table = core.table("t").table
            while table.rate_limiter.waiting["sample"] == 0:
                await asyncio.sleep(0.01)
            for i in range(5):  # each insert wakes the waiter; five are not enough
                await core.extend("t", columns(i, 1), ExtendParams())
                await asyncio.sleep(0.02)
            assert not waiter.done()
            await core.extend("t", columns(5, 1), ExtendParams())
            lease = await waiter
            assert decode(lease.body)["id"].max() <= 5
            rl = table.rate_limiter
            assert rl.sample_waits == 1 and rl.timeouts["sample"] == 0
            assert rl.waiting == {"insert": 0, "sample": 0}
            await core.create(
                TableSpec.model_validate(spec("u", rate_limiter={"min_size_to_sample": 3}))
            )
            with pytest.raises(RateLimitTimeout, match=r"sample timed out after 0\.05s"):
                await core.sample("u", SampleParams(batch_size=2, timeout=0.05))
            other = core.table("u").table.rate_limiter
            assert other.sample_waits == 1 and other.timeouts["sample"] == 1
            assert other.blocked_seconds["sample"] >= 0.05
        finally:
            await core.close()

    run(main())


def test_the_server_timeout_caps_the_callers(tmp_path: Path) -> None:
    core = Core(Settings(root=tmp_path, default_timeout=2.0, max_timeout=5.0))
    assert core.timeout(None) == 2.0 and core.timeout(1.0) == 1.0 and core.timeout(60) == 5.0


def test_every_served_table_gets_the_servers_fsync(tmp_path: Path) -> None:
    """``--fsync always`` holds for a table however it came to be served: created, cleared,
    restored from a checkpoint (a restored table once kept the default, never)."""

    async def main() -> None:
        core = Core(Settings(root=tmp_path, torch_threads=0, fsync="always"))
        try:
            await core.create(TableSpec.model_validate(spec(sampler={"kind": "uniform"})))
            assert core.table("t").table.fsync
            await core.extend("t", columns(0, 4), ExtendParams())
            await core.checkpoint("t", PathBody())
            await core.clear("t")
            assert core.table("t").table.fsync
            await core.restore("t", PathBody())
            assert core.table("t").table.size == 4 and core.table("t").table.fsync
        finally:
            await core.close()

    run(main())


def test_extends_the_rate_limiter_holds_back_count_with_the_bodies_received(
    tmp_path: Path,
) -> None:
    """A held-back extend keeps its rows while it waits: they count in ``--max-receiving-bytes``
    (before, they counted nowhere: any number of waiting extends grew the server), once per
    call however many tables an insert waits in, and are given back when the wait ends."""
    four = sum(c.nbytes for c in columns(0, 4).values())
    limiter = {"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": 8}

    async def main() -> None:
        settings = Settings(root=tmp_path, torch_threads=0, max_receiving_bytes=four * 5 // 2)
        core = Core(settings)
        try:
            for name in ("t", "u", "v"):
                await core.create(TableSpec.model_validate(spec(name, rate_limiter=limiter)))
                await core.extend(name, columns(0, 9), ExtendParams())  # inserts now held back
            table = core.table("t").table
            waits = [
                asyncio.create_task(core.extend("t", columns(9 + 4 * i, 4), ExtendParams()))
                for i in range(2)
            ]
            while table.rate_limiter.waiting["insert"] < 2:
                await asyncio.sleep(0.01)
            assert core.receiving.held == 2 * four
            with pytest.raises(BackendError, match=r"--max-receiving-bytes") as refused:
                await core.extend("t", columns(20, 4), ExtendParams(timeout=30))
            assert f"limit of {four * 5 // 2}" in str(refused.value)
            assert table.rate_limiter.waiting["insert"] == 2 and table.size == 9
            await core.sample("t", SampleParams(batch_size=8))  # lets both in
            await asyncio.gather(*waits)
            assert core.receiving.held == 0 and table.size == 17

            both = parse(InsertParams, {"into": '{"u": null, "v": null}', "timeout": 0.3})
            insert = asyncio.create_task(core.insert(both, columns(9, 4)))
            while core.table("v").table.rate_limiter.waiting["insert"] < 1:
                await asyncio.sleep(0.01)
            assert core.receiving.held == four  # one body, however many tables it waits in
            with pytest.raises(RateLimitTimeout):
                await insert
            assert core.receiving.held == 0  # given back when the waits timed out
        finally:
            await core.close()

    run(main())
