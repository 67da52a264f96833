"""TorchRL collectors write through TDReplayBuffer: every frame stored exactly once.

Each test runs a real collector on gymnasium's CartPole-v1 (with the
:class:`~torchrl_kit.FrameId` transform numbering every step) against a real
server, then reads the table back and checks each env's frames are there
once each, none missing (:func:`~torchrl_kit.check_exactly_once`).
``RayCollector`` has its own module, which starts a Ray runtime: test_ray_collector.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl_kit import check_exactly_once, make_env, stored_frame_ids

from tdreplay.client import ReplayClient
from tdreplay.torchrl import TDReplayBuffer


def run(collector: Any) -> int:
    batches = 0
    try:
        for out in collector:
            assert out is None  # the collector writes to the buffer, yields nothing
            batches += 1
    finally:
        collector.shutdown()
    return batches


def check_table(
    client: ReplayClient, table: str, rb: TDReplayBuffer, frames: int, envs: int
) -> None:
    ids = stored_frame_ids(client, table)
    per_env = check_exactly_once(ids)
    assert len(per_env) == envs
    assert ids.numel() == len(rb) == rb.write_count
    assert ids.numel() >= frames


def test_collector(server: Any, client: ReplayClient, make_table: Callable[..., str]) -> None:
    table = make_table()
    rb = TDReplayBuffer(server.url, table)
    collector = Collector(
        make_env, policy=None, frames_per_batch=50, total_frames=300, replay_buffer=rb
    )
    assert run(collector) == 6
    check_table(client, table, rb, 300, envs=1)


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_multiprocess_collectors(
    cls: type, server: Any, client: ReplayClient, make_table: Callable[..., str]
) -> None:
    """Two worker processes race to create the table from their first batch (``create=``,
    create-if-absent on the server): both go on writing, every frame stored once."""
    table = f"created_by_workers_{cls.__name__}"
    rb = TDReplayBuffer(server.url, table, create={"capacity": 4096})
    collector = cls(
        [make_env, make_env],
        policy=None,
        frames_per_batch=100,
        total_frames=400,
        replay_buffer=rb,
    )
    run(collector)
    check_table(client, table, rb, 400, envs=2)
