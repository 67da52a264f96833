"""What the DQN example and its throughput run share: env, networks, table, buffers, collector."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from tensordict.nn import TensorDictSequential
from torchrl.collectors import MultiAsyncCollector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import ExplorationType, GymEnv, set_exploration_type
from torchrl.modules import MLP, EGreedyModule, QValueActor

from tdreplay.client import ReplayClient, TableExists
from tdreplay.torchrl import TDReplayBuffer

TABLE = "cartpole_dqn"


def make_env() -> GymEnv:
    """CartPole-v1 (module level: the collector's worker processes build their own)."""
    return GymEnv("CartPole-v1")


def table_spec(capacity: int, sampler: str = "prioritized") -> dict[str, Any]:
    """The table: what a TorchRL collector with a Q-value policy emits on CartPole-v1."""
    flag = {"shape": [1], "dtype": "bool"}
    sampler_block: dict[str, Any] = {"kind": sampler}
    if sampler == "prioritized":
        sampler_block.update(alpha=0.6, beta=0.4)
    return {
        "name": TABLE,
        "capacity": capacity,
        "backend": {"kind": "memory"},
        "sampler": sampler_block,
        "fields": {
            "observation": {"shape": [4], "dtype": "float32"},
            "action": {"shape": [2], "dtype": "int64"},
            "action_value": {"shape": [2], "dtype": "float32"},
            "chosen_action_value": {"shape": [1], "dtype": "float32"},
            "done": flag,
            "terminated": flag,
            "truncated": flag,
            "next.observation": {"shape": [4], "dtype": "float32"},
            "next.reward": {"shape": [1], "dtype": "float32"},
            "next.done": flag,
            "next.terminated": flag,
            "next.truncated": flag,
            "collector.traj_ids": {"shape": [], "dtype": "int64"},
        },
    }


def create_table(url: str, capacity: int, sampler: str = "prioritized") -> None:
    """Create the example's table on the server (kept as it is if it exists)."""
    with ReplayClient(url) as client, contextlib.suppress(TableExists):
        client.create_table(table_spec(capacity, sampler))


def make_buffer(kind: str, url: str | None, batch_size: int, capacity: int) -> Any:
    """The replay buffer: TorchRL's in-process one, or tdreplay's. One line differs."""
    if kind == "torchrl":
        return TensorDictReplayBuffer(
            storage=LazyTensorStorage(capacity, shared_init=True), batch_size=batch_size
        )
    if kind == "tdreplay":
        assert url is not None
        return TDReplayBuffer(url, TABLE, batch_size=batch_size)
    raise ValueError(f"buffer must be 'torchrl' or 'tdreplay', got {kind!r}")


def make_actor() -> QValueActor:
    """A Q-network (4 -> 128 -> 128 -> 2) with its greedy action selection."""
    spec = make_env().action_spec
    net = MLP(in_features=4, out_features=2, num_cells=[128, 128], activation_class=torch.nn.ReLU)
    return QValueActor(net, in_keys=["observation"], spec=spec)


def make_explorer(actor: QValueActor, annealing_frames: int) -> TensorDictSequential:
    """The collectors' policy: ``actor`` then epsilon-greedy (1.0 -> 0.05 over ``annealing_frames``)."""
    greedy = EGreedyModule(
        spec=actor.spec, annealing_num_steps=annealing_frames, eps_init=1.0, eps_end=0.05
    )
    return TensorDictSequential(actor, greedy)


def make_collector(policy: Any, rb: Any, frames_per_batch: int) -> MultiAsyncCollector:
    """Two collector processes, each writing its batches to ``rb`` itself."""
    return MultiAsyncCollector(
        [make_env, make_env],
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=-1,
        replay_buffer=rb,
    )


def evaluate(actor: QValueActor, episodes: int = 3) -> float:
    """The greedy policy's average return over ``episodes`` episodes (at most 500 steps each)."""
    env = make_env()
    returns = []
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(episodes):
            rollout = env.rollout(500, actor)
            returns.append(float(rollout["next", "reward"].sum()))
    env.close()
    return sum(returns) / len(returns)
