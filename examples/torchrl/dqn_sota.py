"""DQN on CartPole-v1 written as TorchRL's ``sota-implementations/dqn/dqn_cartpole.py``, with
its replay buffer in a tdreplay server; checkpoints and resumes the whole run.

    python examples/torchrl/dqn_sota.py --out runs/dqn --frames 20000            # train
    python examples/torchrl/dqn_sota.py --out runs/dqn --frames 40000 --resume   # go on
    python examples/torchrl/dqn_sota.py --url http://127.0.0.1:8000 ...          # a running server
    python examples/torchrl/dqn_sota.py --buffer torchrl --sampler uniform ...   # in process

The TorchRL pieces are the sota script's: a ``Collector`` running an e-greedy
``QValueActor`` on a transformed env (``StepCounter``, ``RewardSum``), ``DQNLoss``
with a ``HardUpdate`` target network, Adam and a ``CSVLogger``; the buffer has a
sampling transform (``append_transform``: rewards scaled for the loss) and is
prioritized, so the loss's ``td_error`` goes back with ``update_tensordict_priority``.
The one line that differs from an in-process run is the buffer's (``--buffer``)::

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(N), sampler=PrioritizedSampler(...))
    rb = TDReplayBuffer(url, "dqn_sota", create={"capacity": N, "sampler": "prioritized"})

``--sampler uniform`` makes both sides sample uniformly with replacement
(``RandomSampler``); ``learning_parity.py`` runs the script both ways over seeds.

``torchrl.checkpoint.Checkpoint`` saves the loss module (Q-network and target),
the optimizer, the RNG state and the buffer (its table, streamed from the server
into the checkpoint folder) every ``--save-every`` frames and at the end, keeping
the last two (``CheckpointRotation``). ``--resume`` loads the newest into the
same objects — on any server: loading creates the table — and counts on from the
buffer's ``write_count``; ``--save-every 0`` saves nothing. Logs:
``<out>/logs/dqn/scalars/*.csv``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tensordict.nn import TensorDictSequential
from torchrl.checkpoint import Checkpoint, CheckpointRotation, GlobalRNGState
from torchrl.collectors import Collector
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    TensorDictReplayBuffer,
)
from torchrl.envs import GymEnv, RewardScaling, RewardSum, StepCounter, TransformedEnv
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, HardUpdate
from torchrl.record.loggers.csv import CSVLogger

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from local_server import local_server  # noqa: E402

from tdreplay.torchrl import TDReplayBuffer  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running tdreplay server (default: start one)")
    p.add_argument("--out", type=Path, default=Path("runs/dqn_sota"), help="logs, checkpoints")
    p.add_argument("--resume", action="store_true", help="go on from the newest checkpoint")
    p.add_argument(
        "--buffer",
        choices=["tdreplay", "torchrl"],
        default="tdreplay",
        help="TDReplayBuffer on a server, or TorchRL's TensorDictReplayBuffer in process",
    )
    p.add_argument("--sampler", choices=["prioritized", "uniform"], default="prioritized")
    p.add_argument("--table", default="dqn_sota")
    p.add_argument("--frames", type=int, default=50_000, help="total frames of the run")
    p.add_argument("--init-frames", type=int, default=1_000, help="random frames first")
    p.add_argument("--frames-per-batch", type=int, default=100)
    p.add_argument("--updates-per-batch", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--capacity", type=int, default=10_000)
    p.add_argument(
        "--save-every", type=int, default=10_000, help="frames between checkpoints (0: none)"
    )
    p.add_argument("--lr", type=float, default=2.5e-4)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def make_env(seed: int) -> TransformedEnv:
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    env.append_transform(RewardSum())
    env.set_seed(seed)
    return env


def make_buffer(args: argparse.Namespace, url: str | None) -> TensorDictReplayBuffer:
    """The run's replay buffer: the one line that differs between the two ``--buffer`` s."""
    if args.buffer == "torchrl":
        sampler = (
            PrioritizedSampler(args.capacity, alpha=0.6, beta=0.4)
            if args.sampler == "prioritized"
            else RandomSampler()
        )
        return TensorDictReplayBuffer(
            storage=LazyTensorStorage(args.capacity), sampler=sampler, batch_size=args.batch_size
        )
    if url is None:
        raise ValueError("--buffer tdreplay needs a server URL")
    return TDReplayBuffer(
        url,
        args.table,
        batch_size=args.batch_size,
        create={"capacity": args.capacity, "sampler": args.sampler},
        existing="reuse" if args.resume else "refuse",  # a fresh run starts on an empty table
    )


def train(args: argparse.Namespace, url: str | None) -> dict[str, Any]:
    """Run DQN for ``args.frames`` frames; the summary holds every finished training
    episode as ``episodes``: ``[frames when it ended, its return]`` pairs."""
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    env = make_env(args.seed)
    mlp = MLP(in_features=4, out_features=2, num_cells=[120, 84], activation_class=torch.nn.ReLU)
    actor = QValueActor(mlp, in_keys=["observation"], spec=env.action_spec)
    greedy = EGreedyModule(env.action_spec, annealing_num_steps=args.frames // 4, eps_end=0.05)
    policy = TensorDictSequential(actor, greedy)
    loss_module = DQNLoss(actor, loss_function="l2", delay_value=True)
    loss_module.make_value_estimator(gamma=0.99)
    target_updater = HardUpdate(loss_module, value_network_update_interval=50)
    optim = torch.optim.Adam(loss_module.parameters(), lr=args.lr)
    rb = make_buffer(args, url)
    rb.append_transform(RewardScaling(loc=0.0, scale=0.1, in_keys=[("next", "reward")]))
    logger = CSVLogger(exp_name="dqn", log_dir=str(args.out / "logs"))
    checkpoint = Checkpoint(loss=loss_module, optim=optim, rng=GlobalRNGState(), replay_buffer=rb)
    rotation = CheckpointRotation(args.out / "checkpoints", keep_last=2)

    frames = 0
    if args.resume:
        rotation.load_latest(checkpoint)
        frames = rb.write_count  # every collected frame went into the buffer
        greedy.step(frames)
        print(f"resumed from {rotation.latest()} at {frames} frames", flush=True)
    collector = Collector(
        env,
        policy,
        frames_per_batch=args.frames_per_batch,
        total_frames=max(args.frames - frames, args.frames_per_batch),
        init_random_frames=max(args.init_frames - frames, 0),
    )
    collector.set_seed(args.seed)
    losses: list[float] = []
    episodes: list[list[float]] = []
    save_every = args.save_every if args.save_every > 0 else math.inf
    next_save = (frames // save_every + 1) * save_every
    try:
        for data in collector:
            data = data.reshape(-1)
            rb.extend(data)
            frames += data.numel()
            greedy.step(data.numel())
            returns = data["next", "episode_reward"][data["next", "done"]]
            episodes += [[float(frames), float(r)] for r in returns.reshape(-1).tolist()]
            if returns.numel():
                logger.log_scalar("train/episode_reward", float(returns.mean()), step=frames)
            if frames >= args.init_frames:
                for _ in range(args.updates_per_batch):
                    batch = rb.sample()
                    loss = loss_module(batch)["loss"]  # reads priority_weight, writes td_error
                    optim.zero_grad()
                    loss.backward()
                    optim.step()
                    target_updater.step()
                    rb.update_tensordict_priority(batch)
                    losses.append(loss.item())
                logger.log_scalar("train/q_loss", losses[-1], step=frames)
            collector.update_policy_weights_()
            if frames >= next_save or (frames >= args.frames and args.save_every > 0):
                next_save += save_every
                rotation.save(checkpoint, step=frames)
            if frames >= args.frames:
                break
    finally:
        collector.shutdown()
        if isinstance(rb, TDReplayBuffer):
            rb.close()
        del collector  # TorchRL's weight-sync schemes go while threads can still start
        gc.collect()
    summary: dict[str, Any] = {
        "frames": float(frames),
        "buffer": float(len(rb)),
        "loss": losses[-1] if losses else math.nan,
        "updates": float(len(losses)),
        "seconds": time.perf_counter() - start,
        "episodes": episodes,
    }
    print(
        f"frames {frames}  buffer {len(rb)}  updates {len(losses)}  last loss {summary['loss']:.4f}"
        f"  checkpoint {rotation.latest()}",
        flush=True,
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    server = local_server(args.url) if args.buffer == "tdreplay" else contextlib.nullcontext(None)
    with server as url:
        summary = train(args, url)
    return 0 if math.isfinite(summary["loss"]) else 1


if __name__ == "__main__":
    sys.exit(main())
