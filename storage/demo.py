"""A walk-through of tdreplay's storage layer, no server needed.

    python -m tdreplay.storage.demo --root ./tdreplay-data

On the default memmap backend it creates the ``cartpole`` table from
``schemas/cartpole.yaml``, extends it with synthetic CartPole transitions in
TorchRL's TED layout (what a ``Collector(GymEnv("CartPole-v1"))`` emits),
samples a batch, updates priorities on a prioritized copy of the table,
checkpoints and restores that copy, and exports the table to Parquet,
printing each step. Everything it writes goes under ``<root>/demo``; it runs
in seconds. It locks ``<root>`` while it runs (:mod:`~tdreplay.storage.rootlock`):
on the root of a running server, or of another demo, it stops with an error
naming the holder's PID instead of deleting that process's tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
import torch
from tensordict import TensorDict

from .errors import RootLocked
from .rootlock import lock_root
from .spec import TableSpec
from .table import Table

SCHEMA = Path("schemas") / "cartpole.yaml"


def find_schema() -> Path:
    """``schemas/cartpole.yaml`` of the source tree this module lives in, or under the working folder.

    Raises:
        FileNotFoundError: neither exists (pass ``--schema``).
    """
    here = Path(__file__).resolve()
    for base in (*here.parents, Path.cwd()):
        if (base / SCHEMA).is_file():
            return base / SCHEMA
    from tdreplay.schemas import find  # installed from the wheel: the shipped copy

    shipped = find(SCHEMA.name)
    if shipped is not None:
        return shipped
    raise FileNotFoundError(f"cannot find {SCHEMA}; pass --schema PATH")


def synthetic_rollouts(n: int, *, first_episode: int = 0, seed: int = 0) -> tuple[TensorDict, int]:
    """``n`` CartPole-like transitions in TED layout, episodes of random length back to back.

    Returns:
        The transitions and the number of episodes they start.
    """
    g = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < n:
        lengths.append(int(torch.randint(8, 60, (1,), generator=g)))
    lengths[-1] -= sum(lengths) - n  # the last episode is cut off, as by a collector
    episode = torch.repeat_interleave(
        torch.arange(len(lengths)) + first_episode, torch.tensor(lengths)
    )
    step = torch.cat([torch.arange(k) for k in lengths])
    ends = torch.cat([torch.arange(k) == k - 1 for k in lengths])
    last = ends.clone()
    last[-1] = False  # still running when the rollout ended
    # observations random-walk within an episode; next.observation is the next step's
    drift = torch.randn(n, 4, generator=g) * 0.05
    walk = drift.cumsum(0)
    start = (torch.cumsum(torch.tensor(lengths), 0) - torch.tensor(lengths))[
        episode - first_episode
    ]
    obs = walk - walk[start] + drift[start]
    next_obs = torch.roll(obs, -1, 0)
    next_obs[ends] = obs[ends] + drift[ends]
    action = torch.nn.functional.one_hot(torch.randint(0, 2, (n,), generator=g), 2)
    false = torch.zeros(n, 1, dtype=torch.bool)
    terminated = last[:, None] & (step < 499)[:, None]
    td = TensorDict(
        {
            "observation": obs,
            "action": action,
            "done": false,
            "terminated": false.clone(),
            "truncated": false.clone(),
            "next": {
                "observation": next_obs,
                "reward": torch.ones(n, 1),
                "done": last[:, None].clone(),
                "terminated": terminated,
                "truncated": last[:, None] & ~terminated,
            },
            "collector": {"traj_ids": episode},
        },
        batch_size=[n],
    )
    return td, len(lengths)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tdreplay.storage.demo",
        description="A walk-through of tdreplay's storage layer.",
    )
    parser.add_argument(
        "--root", default="./tdreplay-data", help="data root (demo data goes in <root>/demo)"
    )
    parser.add_argument(
        "--schema", default=None, help="table schema (default: schemas/cartpole.yaml)"
    )
    parser.add_argument("--steps", type=int, default=5000, help="transitions to insert")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    root = Path(args.root).absolute() / "demo"
    try:
        schema = Path(args.schema) if args.schema else find_schema()
    except FileNotFoundError as err:
        parser.error(str(err))
    try:
        lock = lock_root(args.root)
    except RootLocked as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 1
    with lock:
        return walk_through(schema, root, steps=args.steps, t0=t0)


def walk_through(schema: Path, root: Path, *, steps: int, t0: float) -> int:
    """The demo's steps, on tables under ``root`` (the caller holds the data root's lock)."""

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:5.2f}s] {msg}", flush=True)

    # 1. a table from its schema file
    spec = TableSpec.from_file(schema)
    table = Table.create(spec, root, seed=0, replace=True)  # a fresh table each run
    say(
        f"created {table!r}\n         from {schema}; {len(spec.fields)} fields, "
        f"{spec.item_nbytes} bytes per item, storage at {table.backend.location}"
    )

    # 2. extend, as a collector would: one rollout per call
    data, episodes, base = [], 0, 0
    for i in range(5):
        td, k = synthetic_rollouts(steps // 5, first_episode=episodes, seed=i)
        data.append(td)
        episodes += k
        base += len(table.extend(td))
    say(f"extended {base} transitions ({episodes} episodes) in 5 calls; size {len(table)}")

    # 3. sample
    batch = table.sample(256)
    say(
        f"sampled 256: observation {list(batch['observation'].shape)}, "
        f"next.reward {list(batch['next', 'reward'].shape)}, index {batch['index'][:5].tolist()}..."
    )

    # 4. a prioritized copy: same fields, proportional prioritized sampling
    pspec = TableSpec.model_validate(
        {
            **spec.model_dump(),
            "name": "cartpole_prioritized",
            "sampler": {"kind": "prioritized", "alpha": 0.6, "beta": 0.4},
        }
    )
    prio = Table.create(pspec, root, seed=0, replace=True)
    for td in data:
        prio.extend(td)
    batch = prio.sample(1024)
    first = batch["index"] < 1000
    say(
        f"prioritized copy: before updates {first.float().mean():.0%} of draws hit the first 1000 items"
    )
    # a learner would send |TD error|; here the first 1000 items matter 100x more
    index = torch.arange(len(prio))
    prio.update_priority(index, torch.where(index < 1000, 100.0, 1.0))
    batch = prio.sample(1024)
    first = batch["index"] < 1000
    w = batch["sample_info", "weight"]
    say(
        f"after update_priority: {first.float().mean():.0%} hit them; importance weights "
        f"{w[first].mean():.3f} (them) vs {w[~first].mean():.3f} (the rest)"
    )

    # 5. checkpoint and restore, bit for bit
    path = prio.checkpoint(root / "checkpoints" / prio.name)
    restored = Table.restore(path, root / "restored", seed=0)
    same = all(
        torch.equal(a, b)
        for a, b in zip(
            prio.read(prio.live_index()).values(True, True),
            restored.read(restored.live_index()).values(True, True),
            strict=True,
        )
    )
    same_prio = torch.equal(
        prio.sampler.state_dict()["priorities"], restored.sampler.state_dict()["priorities"]
    )
    same_draws = torch.equal(prio.sample(64)["index"], restored.sample(64)["index"])
    say(
        f"checkpointed to {path}\n         restored {len(restored)} items; data identical: {same}, "
        f"priorities identical: {same_prio}, next draws identical: {same_draws}"
    )

    # 6. export the live items, oldest first, to Parquet
    out = table.export(root / "cartpole.parquet")
    meta = pq.read_metadata(out)
    say(
        f"exported {meta.num_rows} rows to {out} ({out.stat().st_size / 1e6:.1f} MB, "
        f"{meta.num_row_groups} row group(s)); read it with pandas.read_parquet or "
        f"TensorDict.from_parquet(path, separator='.'), or Table.import_parquet"
    )
    for t in (table, prio, restored):
        t.close()
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
