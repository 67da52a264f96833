"""The learner's samples/s with 2 collector processes + 1 learner: TorchRL's buffer vs tdreplay's.

    python examples/dqn/throughput.py --json throughput.json
    python examples/dqn/throughput.py --seconds 3 --rounds 1      # quick

The same script runs twice, once per buffer; only the constructor differs
(``common.make_buffer``)::

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(N, shared_init=True), batch_size=B)
    rb = TDReplayBuffer(url, "cartpole_dqn", batch_size=B)

Both with uniform sampling: TorchRL's ``PrioritizedSampler`` needs its C++
extension, which a CPU-only TorchRL may lack (tdreplay's server has a torch
sum tree). Two ``MultiAsyncCollector`` workers collect in the background
(``collector.start()``) and write to the buffer while this process runs
the learner for ``--seconds``: ``sample`` only, then ``sample`` + a DQN
step + ``update_tensordict_priority``. Rounds alternate the buffers; the
median per buffer is reported. ``--json`` writes entries ``{bench,
workload, value, unit, baseline, baseline_value, ratio, goal, pass}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torchrl.objectives import DQNLoss

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from common import create_table, make_actor, make_buffer, make_collector, make_explorer  # noqa: E402
from local_server import local_server  # noqa: E402

BUFFERS = ("torchrl", "tdreplay")
CAPACITY = 100_000


def measure(kind: str, url: str, args: argparse.Namespace) -> dict[str, float]:
    """One round with buffer ``kind``: the learner's samples/s, sampling only and with DQN steps."""
    rb = make_buffer(kind, url, args.batch_size, CAPACITY)
    actor = make_actor()
    loss = DQNLoss(actor, action_space="one-hot", delay_value=True)
    loss.make_value_estimator(gamma=0.99)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-3)
    collector = make_collector(make_explorer(actor, 10_000), rb, args.frames_per_batch)
    collector.start()
    try:
        deadline = time.monotonic() + 120
        while len(rb) < args.init_frames:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kind}: the collectors wrote {len(rb)} frames in 120 s")
            time.sleep(0.05)
        for _ in range(3):  # warm-up: the loss's first calls build what later ones reuse
            loss(rb.sample())["loss"].backward()
        out = {}
        for workload, step in (("sample", False), ("dqn", True)):
            n, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < args.seconds:
                batch = rb.sample()
                if step:
                    losses = loss(batch)
                    optim.zero_grad()
                    losses["loss"].backward()
                    optim.step()
                    rb.update_tensordict_priority(batch)
                n += batch.numel()
            out[workload] = n / (time.monotonic() - t0)
        out["frames"] = float(rb.write_count)
        return out
    finally:
        collector.shutdown()
        if hasattr(rb, "close"):
            rb.close()
        # TorchRL's weight-sync schemes shut down in __del__, which starts a thread: at
        # interpreter exit that thread never starts and the process hangs. Collect them now.
        del collector
        gc.collect()


def entries(
    results: dict[str, list[dict[str, float]]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    names = {
        "sample": f"cartpole sample b{args.batch_size}, 2 collectors writing",
        "dqn": f"cartpole sample b{args.batch_size} + DQN step, 2 collectors writing",
    }
    out = []
    for workload, label in names.items():
        value = statistics.median(r[workload] for r in results["tdreplay"])
        base = statistics.median(r[workload] for r in results["torchrl"])
        out.append(
            {
                "bench": "torchrl_dqn_learner",
                "workload": label,
                "value": round(value),
                "unit": "samples/s",
                "baseline": "torchrl TensorDictReplayBuffer(LazyTensorStorage), in-process",
                "baseline_value": round(base),
                "ratio": round(value / base, 3),
                "goal": ">= 1x",
                "pass": value >= base,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running tdreplay server (default: start one)")
    p.add_argument("--seconds", type=float, default=10.0, help="per workload and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--frames-per-batch", type=int, default=100)
    p.add_argument("--init-frames", type=int, default=2_000)
    p.add_argument("--json", type=Path, help="write the entries here")
    args = p.parse_args(argv)
    results: dict[str, list[dict[str, float]]] = {k: [] for k in BUFFERS}
    with local_server(args.url) as url:
        create_table(url, CAPACITY, sampler="uniform")
        for r in range(args.rounds):
            for kind in BUFFERS if r % 2 == 0 else BUFFERS[::-1]:
                results[kind].append(measure(kind, url, args))
                got = results[kind][-1]
                print(
                    f"round {r} {kind:>8}: sample {got['sample']:9.0f}/s  "
                    f"sample+DQN {got['dqn']:8.0f}/s",
                    flush=True,
                )
    report = entries(results, args)
    for e in report:
        print(
            f"{e['workload']}: tdreplay {e['value']} vs torchrl {e['baseline_value']} "
            f"samples/s ({e['ratio']}x)"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
