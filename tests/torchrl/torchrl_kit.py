"""Helpers of the TorchRL adapter tests, importable by collector worker processes.

:class:`FrameId` numbers every step an env takes: ``("next", "frame_id")`` is
unique across envs and processes and counts up by one per step of an env, so
a table that holds every collected frame exactly once holds, per env, the ids
``base, base+1, ..., base+k-1`` with no repeat and no gap (:func:`check_exactly_once`).
"""

from __future__ import annotations

import io
import itertools
import os
from typing import Any

import pyarrow.parquet as pq
import torch
from tensordict import TensorDictBase
from torchrl.data import Unbounded
from torchrl.envs import GymEnv, Transform, TransformedEnv

#: ids of one env: base + step; envs in a process take the next base
STEPS_PER_ENV = 1 << 24
_instances = itertools.count()

#: CartPole-v1 in TorchRL's TED layout, plus the frame id
CARTPOLE_FIELDS: dict[str, dict[str, Any]] = {
    "observation": {"shape": [4], "dtype": "float32"},
    "action": {"shape": [2], "dtype": "int64"},
    "done": {"shape": [1], "dtype": "bool"},
    "terminated": {"shape": [1], "dtype": "bool"},
    "truncated": {"shape": [1], "dtype": "bool"},
    "frame_id": {"shape": [], "dtype": "int64"},
    "next.observation": {"shape": [4], "dtype": "float32"},
    "next.reward": {"shape": [1], "dtype": "float32"},
    "next.done": {"shape": [1], "dtype": "bool"},
    "next.terminated": {"shape": [1], "dtype": "bool"},
    "next.truncated": {"shape": [1], "dtype": "bool"},
    "next.frame_id": {"shape": [], "dtype": "int64"},
    "collector.traj_ids": {"shape": [], "dtype": "int64"},
}


class FrameId(Transform):
    """Writes ``frame_id``: -1 after a reset, then a fresh id after every step."""

    def __init__(self) -> None:
        super().__init__(in_keys=[], out_keys=["frame_id"])
        self._next_id: int | None = None

    def _fresh(self) -> int:
        if self._next_id is None:  # first use, in the process that runs the env
            base = (os.getpid() % (1 << 20)) * 64 + next(_instances)
            self._next_id = base * STEPS_PER_ENV
        value = self._next_id
        self._next_id += 1
        return value

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        tensordict_reset.set("frame_id", torch.full(tensordict_reset.shape, -1, dtype=torch.int64))
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        ids = torch.tensor([self._fresh() for _ in range(max(1, next_tensordict.numel()))])
        next_tensordict.set("frame_id", ids.reshape(next_tensordict.shape))
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Any) -> Any:
        observation_spec["frame_id"] = Unbounded(
            shape=observation_spec.shape, dtype=torch.int64, device=observation_spec.device
        )
        return observation_spec


def make_env() -> TransformedEnv:
    """CartPole-v1 with :class:`FrameId` (a module-level function: workers unpickle it)."""
    return TransformedEnv(GymEnv("CartPole-v1"), FrameId())


def table_spec(name: str, *, capacity: int = 4096, sampler: str = "uniform") -> dict[str, Any]:
    """A memory table holding :data:`CARTPOLE_FIELDS`."""
    block: dict[str, Any] = {"kind": sampler}
    if sampler == "prioritized":
        block.update(alpha=0.6, beta=0.4)
    return {
        "name": name,
        "capacity": capacity,
        "fields": CARTPOLE_FIELDS,
        "backend": {"kind": "memory"},
        "sampler": block,
    }


def stored_frame_ids(client: Any, table: str) -> torch.Tensor:
    """Every ``next.frame_id`` the table holds, read from its Parquet export."""
    data = client.export(table, "parquet")
    column = pq.read_table(io.BytesIO(data)).column("next.frame_id")
    return torch.tensor(column.to_pylist(), dtype=torch.int64)


def check_exactly_once(ids: torch.Tensor) -> dict[int, int]:
    """Assert ``ids`` hold each frame of each env once, none missing; returns frames per env."""
    assert ids.numel() > 0, "no frame stored"
    assert (ids >= 0).all(), "a stored frame has no id"
    unique = torch.unique(ids)
    assert unique.numel() == ids.numel(), f"{ids.numel() - unique.numel()} frames stored twice"
    per_env: dict[int, int] = {}
    for env in torch.unique(ids // STEPS_PER_ENV).tolist():
        steps = torch.sort(ids[ids // STEPS_PER_ENV == env] % STEPS_PER_ENV).values
        expected = torch.arange(steps.numel())
        missing = sorted(set(expected.tolist()) - set(steps.tolist()))[:5]
        assert torch.equal(steps, expected), f"env {env}: steps missing, e.g. {missing}"
        per_env[env] = steps.numel()
    return per_env
