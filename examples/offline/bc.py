"""Offline RL: record demonstrations in a table, export it to Parquet, train behaviour cloning.

    python examples/offline/bc.py            # ~20k demonstration frames, checks the clone balances the pole
    python examples/offline/bc.py --smoke    # a few seconds
    python examples/offline/bc.py --url http://127.0.0.1:8000

1. A TorchRL ``Collector`` runs a scripted CartPole-v1 controller and writes
   its frames to a table through ``TDReplayBuffer`` (``replay_buffer=``).
2. The table is exported to Parquet (``ReplayClient.export``): one column
   per field (``next.reward``...), shapes and dtypes in the field metadata.
3. The file is read twice: with pandas (a quick look), and with tensordict's
   ``TensorDict.from_parquet(path, separator=".")``, which nests the dotted
   columns back into the TED layout.
4. A small network learns ``observation -> action`` from that TensorDict;
   the clone then plays CartPole-v1 greedily.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector
from torchrl.envs import ExplorationType, GymEnv, set_exploration_type

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_server import local_server

from tdreplay.client import ReplayClient
from tdreplay.torchrl import TDReplayBuffer, spec_from_tensordict


def expert(td: TensorDictBase) -> TensorDictBase:
    """A scripted controller: push the cart toward where the pole falls (one-hot action)."""
    obs = td["observation"]
    right = (obs[..., 2] + 0.5 * obs[..., 3] > 0).long()
    td["action"] = torch.nn.functional.one_hot(right, 2)
    return td


def record(url: str, table: str, frames: int) -> None:
    """Fill ``table`` with ``frames`` frames of the controller, through a TorchRL collector."""
    env = GymEnv("CartPole-v1")
    example = env.rollout(2, expert)
    example["collector", "traj_ids"] = torch.zeros(2, dtype=torch.int64)
    with ReplayClient(url) as client:
        client.create_table(spec_from_tensordict(example, table, capacity=frames))
    rb = TDReplayBuffer(url, table)
    collector = Collector(env, expert, frames_per_batch=1000, total_frames=frames, replay_buffer=rb)
    for _ in collector:
        pass
    collector.shutdown()
    print(f"recorded {len(rb)} frames in table {table!r}")


def load(path: Path) -> TensorDict:
    """The exported table, read with pandas (a look) and with TensorDict.from_parquet."""
    frame = pd.read_parquet(path, columns=["observation", "action", "next.reward"])
    print(f"pandas: {len(frame)} rows, columns {list(frame.columns)}")
    print(frame.head(3).to_string())
    td = TensorDict.from_parquet(path, separator=".")
    print(f"TensorDict.from_parquet: batch {list(td.batch_size)}, keys {sorted(td.keys())}")
    return td


def clone(data: TensorDict, epochs: int) -> TensorDictModule:
    """Behaviour cloning: cross-entropy of the recorded actions given the observations."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    optim = torch.optim.Adam(net.parameters(), lr=3e-3)
    obs, target = data["observation"], data["action"].argmax(-1)
    for epoch in range(epochs):
        for idx in torch.randperm(len(obs)).split(256):
            loss = torch.nn.functional.cross_entropy(net(obs[idx]), target[idx])
            optim.zero_grad()
            loss.backward()
            optim.step()
        accuracy = (net(obs).argmax(-1) == target).float().mean()
        print(f"epoch {epoch}: loss {loss.item():.3f}, accuracy {accuracy:.3f}")

    def act(logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(logits.argmax(-1), 2)

    policy = torch.nn.Sequential(net, _Lambda(act))
    return TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])


class _Lambda(torch.nn.Module):
    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)  # type: ignore[operator]


def play(policy: TensorDictModule, episodes: int = 3) -> float:
    env = GymEnv("CartPole-v1")
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        returns = [float(env.rollout(500, policy)["next", "reward"].sum()) for _ in range(episodes)]
    return sum(returns) / len(returns)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running tdreplay server (default: start one)")
    p.add_argument("--smoke", action="store_true", help="a short run that checks every step")
    p.add_argument("--frames", type=int, default=20_000)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--table", default="cartpole_expert")
    args = p.parse_args(argv)
    if args.smoke:
        args.frames, args.epochs = 1_000, 1
    with local_server(args.url) as url, tempfile.TemporaryDirectory() as tmp:
        record(url, args.table, args.frames)
        path = Path(tmp) / f"{args.table}.parquet"
        ReplayClient(url).export(args.table, "parquet", dest=path)
        print(f"exported to Parquet: {path.stat().st_size} bytes")
        data = load(path)
    policy = clone(data, args.epochs)
    score = play(policy)
    print(f"behaviour clone's average return: {score:.1f}")
    return 0 if args.smoke or score >= 195 else 1


if __name__ == "__main__":
    sys.exit(main())
