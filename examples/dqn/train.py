"""DQN on CartPole-v1: 2 collector processes + 1 learner, prioritized replay in a tdreplay server.

    python examples/dqn/train.py                 # full: until the greedy return averages >= 195
                                                 # over 3 evaluations (of 3 episodes each)
    python examples/dqn/train.py --smoke         # a few seconds, checks the loop runs
    python examples/dqn/train.py --url http://127.0.0.1:8000   # use a running server

Without ``--url`` a server is started for the run. Two TorchRL collector
processes (``MultiAsyncCollector``) write their frames to the table through
their own connections (``replay_buffer=TDReplayBuffer(...)``); this process
samples batches, runs TorchRL's ``DQNLoss`` (which reads ``priority_weight``
and writes ``td_error``), steps the optimizer, sends the new priorities back
with ``update_tensordict_priority`` and pushes the weights to the collectors.
Full mode writes ``learning_curve.png`` (greedy return vs frames collected,
and the learner's samples/s) and ``learning_curve.json`` beside this file.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch
from torchrl.objectives import DQNLoss, SoftUpdate

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from common import create_table, evaluate, make_actor, make_buffer, make_collector, make_explorer  # noqa: E402
from local_server import local_server  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running tdreplay server (default: start one)")
    p.add_argument("--smoke", action="store_true", help="a short run that checks the loop")
    p.add_argument("--target", type=float, default=195.0, help="stop at this average return")
    p.add_argument("--max-frames", type=int, default=150_000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--frames-per-batch", type=int, default=100, help="per collector write")
    p.add_argument("--updates-per-batch", type=int, default=50)
    p.add_argument("--init-frames", type=int, default=1_000, help="collected before learning")
    p.add_argument("--eval-every", type=int, default=1_000, help="frames between evaluations")
    p.add_argument("--window", type=int, default=3, help="evaluations averaged for --target")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "learning_curve.png")
    args = p.parse_args(argv)
    if args.smoke:
        args.max_frames, args.init_frames, args.eval_every = 1_500, 300, 500
        args.updates_per_batch, args.out = 5, None
    return args


def train(args: argparse.Namespace, url: str) -> list[dict[str, float]]:
    torch.manual_seed(args.seed)
    create_table(url, capacity=100_000, sampler="prioritized")
    rb = make_buffer("tdreplay", url, args.batch_size, capacity=100_000)
    actor = make_actor()
    explorer = make_explorer(actor, annealing_frames=20_000)
    loss = DQNLoss(actor, action_space="one-hot", delay_value=True, double_dqn=True)
    loss.make_value_estimator(gamma=0.99)
    target_updater = SoftUpdate(loss, eps=0.99)
    optim = torch.optim.Adam(loss.parameters(), lr=args.lr)
    collector = make_collector(explorer, rb, args.frames_per_batch)

    curve: list[dict[str, float]] = []
    sampled, learn_time, next_eval, frames = 0, 0.0, args.init_frames, 0
    start = time.monotonic()
    try:
        for _ in collector:  # one step per batch a collector wrote to the table
            frames = rb.write_count
            if frames < args.init_frames:
                continue
            t0 = time.monotonic()
            for _ in range(args.updates_per_batch):
                batch = rb.sample()
                losses = loss(batch)  # reads batch["priority_weight"], writes batch["td_error"]
                optim.zero_grad()
                losses["loss"].backward()
                optim.step()
                target_updater.step()
                rb.update_tensordict_priority(batch)
                sampled += batch.numel()
            learn_time += time.monotonic() - t0
            explorer[-1].step(args.frames_per_batch)
            collector.update_policy_weights_()
            if frames >= next_eval:
                next_eval += args.eval_every
                point = {
                    "frames": float(frames),
                    "return": evaluate(actor),
                    "samples_per_s": sampled / max(learn_time, 1e-9),
                    "seconds": time.monotonic() - start,
                }
                curve.append(point)
                recent = [p["return"] for p in curve[-args.window :]]
                point["average"] = sum(recent) / len(recent)
                sampled, learn_time = 0, 0.0
                print(
                    f"frames {frames:>7}  return {point['return']:6.1f}  "
                    f"average {point['average']:6.1f}  "
                    f"learner {point['samples_per_s']:8.0f} samples/s  {point['seconds']:5.0f} s",
                    flush=True,
                )
                solved = len(recent) == args.window and point["average"] >= args.target
                if solved or frames >= args.max_frames:
                    break
    finally:
        collector.shutdown()
        rb.close()
        del collector  # TorchRL's weight-sync schemes must go while threads can still start
        gc.collect()  # (their __del__ starts one: at interpreter exit that hangs)
    return curve


def plot(curve: list[dict[str, float]], out: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = [p["frames"] for p in curve]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot(frames, [p["return"] for p in curve], marker="o", label="greedy return (3 episodes)")
    top.plot(frames, [p["average"] for p in curve], label="average of the last evaluations")
    top.axhline(target, color="grey", linestyle="--", label=f"target {target:g}")
    top.set_ylabel("return")
    top.set_title("DQN on CartPole-v1: 2 collectors + 1 learner through tdreplay")
    top.legend()
    bottom.plot(frames, [p["samples_per_s"] for p in curve], marker="o", color="tab:orange")
    bottom.set_ylabel("learner samples/s")
    bottom.set_xlabel("frames collected")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    out.with_suffix(".json").write_text(json.dumps(curve, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with local_server(args.url) as url:
        curve = train(args, url)
    if not curve:
        print("no evaluation ran", file=sys.stderr)
        return 1
    if args.out is not None:
        plot(curve, args.out, args.target)
        print(f"wrote {args.out}")
    if args.smoke:
        return 0
    return 0 if curve[-1]["average"] >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
