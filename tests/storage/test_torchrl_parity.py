"""Real TorchRL rollouts: a table stores them exactly as TorchRL's own ReplayBuffer does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from storage_helpers import assert_bitwise_equal
from tensordict import TensorDict

from tdreplay.storage import TableSpec

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
CAPACITY = 200

# importing TorchRL's collectors announces deprecations of its own classes
pytestmark = pytest.mark.filterwarnings("ignore:Creating .*WeightUpdater:DeprecationWarning")


@pytest.fixture(scope="module")
def rollouts() -> list[TensorDict]:
    """Five 64-step batches of CartPole-v1 from a TorchRL Collector with a random policy."""
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv

    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    collector = Collector(env, policy=None, frames_per_batch=64, total_frames=320)
    try:
        batches = [batch.clone() for batch in collector]
    finally:
        collector.shutdown()
    assert len(batches) == 5 and all(b.batch_size == torch.Size([64]) for b in batches)
    return batches


def cartpole(backend: str, **extra) -> TableSpec:
    spec = TableSpec.from_file(SCHEMAS / "cartpole.yaml")
    return TableSpec.model_validate(
        {
            **spec.model_dump(mode="json"),
            "capacity": CAPACITY,
            "backend": {"kind": backend},
            **extra,
        }
    )


def torchrl_buffer(rollouts: list[TensorDict]):
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY))
    for batch in rollouts:
        rb.extend(batch)
    return rb


@pytest.mark.parametrize("ted2flat", [False, True], ids=["plain", "ted2flat"])
@pytest.mark.parametrize("backend", ["memmap", "h5", "memory"])
def test_table_matches_torchrl_storage_through_a_checkpoint(
    rollouts: list[TensorDict], tables, tmp_path: Path, backend: str, ted2flat: bool
) -> None:
    table = tables.create(cartpole(backend))
    for batch in rollouts:  # the collector's output goes in as it comes
        table.extend(batch)
    rb = torchrl_buffer(rollouts)
    # 320 steps into 200 slots: both rings wrapped to the same cursor
    assert table.writer.cursor == rb._writer._cursor == 320 % CAPACITY
    assert len(table) == len(rb) == CAPACITY

    path = table.checkpoint(tmp_path / "ckpt", ted2flat=ted2flat)
    restored = tables.restore(path, root=tmp_path / "restored")
    slots = torch.arange(CAPACITY)
    ours = restored.read(slots)
    theirs = rb.storage[slots]
    keys = [k for k in ours.keys(True, True)]
    assert sorted(map(str, keys)) == sorted(map(str, theirs.keys(True, True)))
    assert_bitwise_equal(ours, theirs, keys)

    # oldest first, the live items are the last 200 steps the collector produced
    steps = torch.cat(rollouts)
    assert_bitwise_equal(restored.read(restored.live_index()), steps[-CAPACITY:], keys)

    # and what it samples is what TorchRL holds in those slots
    batch = restored.sample(64)
    assert_bitwise_equal(batch, rb.storage[batch["index"]], keys)


def test_slices_of_collector_trajectories(rollouts: list[TensorDict], tables) -> None:
    """The slice sampler keyed on the collector's traj_ids never mixes two episodes."""
    table = tables.create(
        cartpole(
            "memory",
            sampler={"kind": "slice", "slice_len": 4, "traj_key": "collector.traj_ids"},
        )
    )
    for batch in rollouts:
        table.extend(batch)
    for _ in range(10):
        batch = table.sample(64).reshape(-1, 4)
        traj = batch["collector", "traj_ids"]
        assert (traj == traj[:, :1]).all()
        # consecutive steps: each next observation is the following observation
        assert torch.equal(batch["next", "observation"][:, :-1], batch["observation"][:, 1:])
        assert not batch["next", "done"][:, :-1].any()
