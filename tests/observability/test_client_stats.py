"""``client.stats(table)``: flat TorchRL-style figures, both twins, merged over shards."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from obs_helpers import spec
from testkit import rows

from tdreplay.client import AsyncReplayClient, ReplayClient

LIMITER = {"samples_per_insert": 2.0, "error_buffer": 100.0, "min_size_to_sample": 1}


@pytest.fixture(scope="module")
def servers(live_server: Any) -> list[Any]:
    return [live_server(), live_server()]


def test_one_server_both_twins(servers: list[Any]) -> None:
    client = ReplayClient(servers[0].url, transport="http")
    client.create_table(spec("c", {"kind": "prioritized"}, rate_limiter=LIMITER))
    client.extend("c", rows(0, 10))
    client.sample("c", 4)
    stats = client.stats("c")
    assert all(k.startswith("buffer/") and isinstance(v, float) for k, v in stats.items())
    assert stats["buffer/size"] == 10 and stats["buffer/capacity"] == 64
    assert stats["buffer/fill"] == pytest.approx(10 / 64)
    assert (stats["buffer/inserts"], stats["buffer/samples"]) == (10, 4)
    assert stats["buffer/samples_per_insert"] == pytest.approx(0.4)
    assert stats["buffer/samples_per_insert_target"] == 2.0
    assert stats["buffer/times_sampled_mean"] == pytest.approx(0.4)
    assert 1 <= stats["buffer/unique_sampled"] <= 4
    assert stats["buffer/priority_max"] == 1.0 and stats["buffer/priority_sum"] == 10.0
    assert stats["buffer/blocked_insert_s"] == 0.0
    assert "buffer/trajectories" not in stats and "buffer/checkpoint_age_s" not in stats
    assert set(client.stats("c", prefix="rb/")) == {k.replace("buffer/", "rb/") for k in stats}

    async def twin() -> dict[str, float]:
        async with AsyncReplayClient(servers[0].url, transport="http") as aclient:
            return await aclient.stats("c")

    assert asyncio.run(twin()) == {k: v for k, v in stats.items() if "age" not in k}


def test_sharded_figures_are_merged(servers: list[Any]) -> None:
    client = ReplayClient([s.url for s in servers], transport="http")
    client.create_table(spec("sh", {"kind": "prioritized"}, rate_limiter=LIMITER))
    for i in range(4):  # round robin: 2 extends of 3 rows each
        client.extend("sh", rows(10 * i, 3))
    client.sample("sh", 6)
    each = [ReplayClient(s.url, transport="http").stats("sh") for s in servers]
    merged = client.stats("sh")
    assert merged["buffer/shards"] == 2
    for key in ("size", "capacity", "inserts", "samples", "unique_sampled", "priority_sum"):
        assert merged[f"buffer/{key}"] == sum(e[f"buffer/{key}"] for e in each)
    assert merged["buffer/size"] == 12 and merged["buffer/samples"] == 6
    assert merged["buffer/samples_per_insert"] == pytest.approx(0.5)
    assert merged["buffer/priority_max"] == max(e["buffer/priority_max"] for e in each)
    assert merged["buffer/sample_headroom"] == sum(e["buffer/sample_headroom"] for e in each)
