"""An AgileRL-style ``Transition`` tensorclass declared as a table, filled and sampled.

    python examples/tensorclass/transitions.py
    python examples/tensorclass/transitions.py --smoke
    python examples/tensorclass/transitions.py --url http://127.0.0.1:8000

Libraries such as AgileRL keep experience as a ``@tensorclass``
(``obs``, ``action``, ``reward``, ``next_obs``, ``done``) rather than
TorchRL's TED layout. The table is declared from the class's fields
(:func:`tdreplay.torchrl.spec_from_tensordict` on an example instance), a
plain gymnasium loop appends ``Transition`` batches (``ReplayClient.extend``
takes tensorclasses), and batches come back as ``Transition`` objects
(``sample(..., as_cls=Transition)``) — or, through ``TDReplayBuffer``, as
TensorDicts a TorchRL loss can read, with ``Transition.from_tensordict``
one call away.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tensordict import tensorclass

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_server import local_server

from tdreplay.client import ReplayClient
from tdreplay.torchrl import TDReplayBuffer, spec_from_tensordict


@tensorclass
class Transition:
    """One step of experience, as AgileRL's replay buffers hold it."""

    obs: torch.Tensor  # float32 [4]
    action: torch.Tensor  # int64 []
    reward: torch.Tensor  # float32 []
    next_obs: torch.Tensor  # float32 [4]
    done: torch.Tensor  # bool []


def collect(steps: int, seed: int = 0) -> Transition:
    """``steps`` transitions of a random policy on CartPole-v1, as one ``Transition`` batch."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    rows = []
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rows.append((obs, action, reward, next_obs, terminated or truncated))
        obs = env.reset()[0] if terminated or truncated else next_obs
    env.close()
    o, a, r, n, d = zip(*rows, strict=True)
    return Transition(
        obs=torch.as_tensor(np.stack(o), dtype=torch.float32),
        action=torch.as_tensor(np.array(a), dtype=torch.int64),
        reward=torch.as_tensor(np.array(r), dtype=torch.float32),
        next_obs=torch.as_tensor(np.stack(n), dtype=torch.float32),
        done=torch.as_tensor(np.array(d), dtype=torch.bool),
        batch_size=[steps],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running tdreplay server (default: start one)")
    p.add_argument("--smoke", action="store_true", help="a short run")
    p.add_argument("--steps", type=int, default=5_000)
    p.add_argument("--table", default="transitions")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps = 500
    with local_server(args.url) as url, ReplayClient(url) as client:
        # 1. declare the table from the class: one field per tensorclass field
        spec = spec_from_tensordict(collect(1)._tensordict, args.table, capacity=100_000)
        client.create_table(spec)
        print("table fields:", {k: (v["shape"], v["dtype"]) for k, v in spec["fields"].items()})

        # 2. fill it: extend takes the tensorclass as it is
        for start in range(0, args.steps, 250):
            client.extend(args.table, collect(min(250, args.steps - start), seed=start))
        print(f"{client.info(args.table)['size']} transitions stored")

        # 3. sample Transition batches (index and sample_info are left out: not fields)
        batch = client.sample(args.table, 64, as_cls=Transition)
        assert isinstance(batch, Transition) and batch.obs.shape == (64, 4)
        print(
            f"sampled {type(batch).__name__}: obs {tuple(batch.obs.shape)}, "
            f"mean reward {batch.reward.mean():.2f}, dones {int(batch.done.sum())}"
        )

        # 4. the same table as a TorchRL buffer: TensorDicts, and back to Transition
        rb = TDReplayBuffer(client, args.table, batch_size=32)
        rb.extend(collect(100, seed=99))
        td = rb.sample()
        names = [f.name for f in dataclasses.fields(Transition)]
        again = Transition.from_tensordict(td.select(*names))
        print(
            f"TDReplayBuffer sample: keys {sorted(td.keys())} -> {type(again).__name__}"
            f"{tuple(again.batch_size)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
