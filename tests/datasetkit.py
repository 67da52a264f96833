"""For the dataset tests: transitions in TorchRL's TED layout whose values say which episode
and step they are, so boundaries and the T+1 observations can be checked; a check that a
Minari dataset's spaces contain its data; tables on a live server and the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import ReplayClient

FIELDS: dict[str, Any] = {
    "observation": {"shape": [3], "dtype": "float32"},
    "action": {"shape": [2], "dtype": "int64"},
    "done": {"shape": [1], "dtype": "bool"},
    "next.observation": {"shape": [3], "dtype": "float32"},
    "next.reward": {"shape": [1], "dtype": "float32"},
    "next.done": {"shape": [1], "dtype": "bool"},
    "next.terminated": {"shape": [1], "dtype": "bool"},
    "next.truncated": {"shape": [1], "dtype": "bool"},
    "traj": {"shape": [], "dtype": "int64"},
}


def transitions(lengths: list[int], *, truncate_last: bool = False, traj0: int = 0) -> TensorDict:
    """Episodes of the given lengths, one after another; step t of episode e observes
    ``[e, t, 0]`` and ends in ``[e, t + 1, 0]`` (so the T+1 observations are checkable)."""
    obs, nxt, reward, term, trunc, traj = [], [], [], [], [], []
    for e, n in enumerate(lengths):
        for t in range(n):
            obs.append([e, t, 0.0])
            nxt.append([e, t + 1, 0.0])
            reward.append([10.0 * e + t])
            last = t == n - 1
            term.append([last and not (truncate_last and e == len(lengths) - 1)])
            trunc.append([last and truncate_last and e == len(lengths) - 1])
            traj.append(traj0 + e)
    n = len(obs)
    term_t, trunc_t = torch.tensor(term), torch.tensor(trunc)
    return TensorDict(
        {
            "observation": torch.tensor(obs),
            "action": torch.arange(2 * n).reshape(n, 2),
            "done": torch.zeros(n, 1, dtype=torch.bool),
            "next": {
                "observation": torch.tensor(nxt),
                "reward": torch.tensor(reward),
                "done": term_t | trunc_t,
                "terminated": term_t,
                "truncated": trunc_t,
            },
            "traj": torch.tensor(traj),
        },
        [n],
    )


def contains_every_step(ds: Any) -> int:
    """How many steps were checked: every observation and action of every episode lies in
    the dataset's spaces."""
    steps = 0
    for e in ds.iterate_episodes():
        obs = e.observations
        for i in range(len(e.rewards) + 1):
            assert ds.observation_space.contains(_step(obs, i)), (e.id, i, _step(obs, i))
        for i in range(len(e.rewards)):
            assert ds.action_space.contains(_step(e.actions, i)), (e.id, i, _step(e.actions, i))
            steps += 1
    return steps


def _step(values: Any, i: int) -> Any:
    if isinstance(values, dict):
        return {k: _step(v, i) for k, v in values.items()}
    return np.asarray(values[i])


def make_table(client: ReplayClient, *, fields: dict | None = None, **extra: Any) -> str:
    name = unique("ds")
    client.create_table(
        {"name": name, "capacity": 100, "backend": {"kind": "memory"}, "fields": fields or FIELDS}
        | extra
    )
    return name


def hidden(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob(".*")]


def one_page(path: Path, rows: int) -> Path:
    """A Parquet file of ``rows`` float64 zeros (column ``x``) in one zstd page of one row
    group: a few KB on disk, ``8 * rows`` bytes decompressed (pyarrow decompresses a page
    whole)."""
    values = pa.table({"x": np.zeros(rows)})
    pq.write_table(
        values, path, compression="zstd", use_dictionary=False, write_statistics=False,
        data_page_size=1 << 40, row_group_size=rows, max_rows_per_page=rows + 1,
    )  # fmt: skip
    return path
