"""End to end through the client: TorchRL collectors -> tdreplay server -> learner, then restart.

Real ``tdreplay serve`` processes (the shipped cartpole schema), real TorchRL
``Collector(GymEnv("CartPole-v1"))`` rollouts pushed as they come, a learner
reading through the prefetching loader, and a checkpoint that survives a
server restart.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from tensordict import TensorDict, tensorclass

from tdreplay.client import ReplayClient, Unauthorized

torchrl_envs = pytest.importorskip("torchrl.envs")
torchrl_collectors = pytest.importorskip("torchrl.collectors")
pytest.importorskip("gymnasium")

TOKEN = "e2e-token"


@tensorclass
class Transition:
    observation: torch.Tensor
    action: torch.Tensor
    next: TensorDict


def collect(client: ReplayClient, frames: int, seed: int, errors: list[BaseException]) -> None:
    """One collector: every batch extends ``cartpole`` as is, and feeds a writer of slices."""
    try:
        env = torchrl_envs.GymEnv("CartPole-v1")
        env.set_seed(seed)
        collector = torchrl_collectors.Collector(
            env, None, frames_per_batch=64, total_frames=frames
        )
        with client.writer(
            "cartpole_seq", chunk=64, max_delay=None, episode_key="collector.traj_ids"
        ) as w:
            for batch in collector:
                # Separate Collector instances all number their trajectories from 0;
                # a traj_key table needs ids unique across collectors.
                batch["collector", "traj_ids"] += seed * 1_000_000
                client.extend("cartpole", batch)
                w.append(batch)
        collector.shutdown()
    except BaseException as err:  # surfaced by the test
        errors.append(err)


def test_collectors_learner_and_restart(live_server: Any, tmp_path: Any) -> None:
    server = live_server("--schema", "schemas/cartpole.yaml", backend="memory", token=TOKEN)
    client = ReplayClient(server.url, token=TOKEN)
    with pytest.raises(Unauthorized):
        ReplayClient(server.url).info("cartpole")
    fields = client.info("cartpole")["fields"]
    client.create_table(
        {
            "name": "cartpole_seq",
            "capacity": 4096,
            "backend": {"kind": "memory"},
            "fields": fields,
            "sampler": {"kind": "slice", "slice_len": 4, "traj_key": "collector.traj_ids"},
        }
    )

    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=collect, args=(client, 512, seed, errors)) for seed in (1, 2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert client.info("cartpole")["size"] == 1024

    # the learner: typed batches, prefetched
    seen = 0
    for batch in client.loader("cartpole", 128, prefetch=2, num_batches=8, as_cls=Transition):
        assert isinstance(batch, Transition) and batch.batch_size == torch.Size([128])
        assert batch.observation.dtype == torch.float32 and batch.action.shape == (128, 2)
        assert batch.next["done"].dtype == torch.bool
        seen += 1
    assert seen == 8

    # slices never cross an episode: within a slice, each step starts where the last ended
    Step = client.tensorclass("cartpole_seq")
    for batch in client.loader("cartpole_seq", 64, num_batches=4, as_cls=Step):
        slices = batch._tensordict.reshape(-1, 4)
        traj = slices["collector", "traj_ids"]
        assert (traj == traj[:, :1]).all()
        assert torch.equal(slices["next", "observation"][:, :-1], slices["observation"][:, 1:])
        assert not slices["next", "done"][:, :-1].any()

    # a checkpoint survives a restart of the server on the same data root
    client.checkpoint("cartpole", "checkpoints/cartpole")
    before = client.info("cartpole")
    server.stop()
    again = live_server("--restore", token=TOKEN, root=server.root)
    client2 = ReplayClient(again.url, token=TOKEN)
    after = client2.info("cartpole")
    assert after["size"] == before["size"] == 1024
    assert client2.sample("cartpole", 32).batch_size == torch.Size([32])
