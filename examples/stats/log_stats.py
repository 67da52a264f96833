"""Log a replay table's figures with a training loop's own logger.

A collector thread fills a prioritized table with samples-per-insert 4
while a learner loop samples and updates priorities (each waits on the other
now and then, as the rate limiter says), and every ``--log-every`` steps logs ``client.stats(table)`` - flat
TorchRL-style keys (``buffer/size``, ``buffer/samples_per_insert``,
``buffer/blocked_sample_s``, ``buffer/priority_max``, ...) - with TorchRL's
``CSVLogger``; any logger with ``log_scalar(name, value, step)`` does.

    python examples/stats/log_stats.py                       # starts its own server
    python examples/stats/log_stats.py --url http://host:8000 --steps 2000
    python examples/stats/log_stats.py --smoke               # a few steps (the tests run this)

Then open ``http://127.0.0.1:<port>/status`` for the same figures as plots.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.record.loggers.csv import CSVLogger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from local_server import local_server

from tdreplay.client import RateLimitTimeout, ReplayClient, TableExists

SPEC = {
    "name": "stats-demo",
    "capacity": 4096,
    "fields": {
        "obs": {"shape": [4], "dtype": "float32"},
        "reward": {"shape": [], "dtype": "float32"},
    },
    "backend": {"kind": "memory"},
    "sampler": {"kind": "prioritized", "alpha": 0.6, "beta": 0.4},
    "rate_limiter": {"samples_per_insert": 4.0, "error_buffer": 256.0, "min_size_to_sample": 64},
}


def collect(url: str, stop: threading.Event) -> None:
    """The collector: 32 steps at a time until ``stop``, held back by the rate limiter."""
    client = ReplayClient(url)
    while not stop.is_set():
        n = 32
        data = TensorDict({"obs": torch.randn(n, 4), "reward": torch.rand(n)}, [n])
        try:
            client.extend(SPEC["name"], data, timeout=0.5)
        except RateLimitTimeout:  # the learner is behind: try again (or stop)
            continue


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument(
        "--log-dir", default=None, help="where the CSV logs go (default: a temp dir)"
    )
    parser.add_argument("--smoke", action="store_true", help="a few steps, for the tests")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.log_every = 40, 10
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="tdreplay-stats-")
    logger = CSVLogger("replay-stats", log_dir=log_dir)
    name = SPEC["name"]
    stats: dict[str, float] = {}
    with local_server(args.url) as url:
        learner = ReplayClient(url)
        with contextlib.suppress(TableExists):  # a server that has it from an earlier run
            learner.create_table(SPEC)
        stop = threading.Event()
        collector = threading.Thread(target=collect, args=(url, stop), daemon=True)
        collector.start()
        try:
            for step in range(args.steps):
                batch = learner.sample(name, 64)  # waits for the collector when it is ahead
                td_error = batch["reward"] + 0.1 * torch.rand(64)
                learner.update_priority(
                    name, batch["index"], td_error, key=batch["sample_info", "key"]
                )
                if (step + 1) % args.log_every == 0:
                    stats = learner.stats(name)
                    for key, value in stats.items():
                        logger.log_scalar(key, value, step=step)
                    print(
                        f"step {step + 1}: size {stats['buffer/size']:.0f}, samples/insert "
                        f"{stats['buffer/samples_per_insert']:.2f} (target "
                        f"{stats['buffer/samples_per_insert_target']:.0f}), priority max "
                        f"{stats['buffer/priority_max']:.2f}, learner blocked "
                        f"{stats['buffer/blocked_sample_s']:.2f} s, collector blocked "
                        f"{stats['buffer/blocked_insert_s']:.2f} s"
                    )
        finally:
            stop.set()
            collector.join(5)
    print(f"{len(stats)} figures logged to {Path(log_dir) / 'replay-stats'}")
    return stats


if __name__ == "__main__":
    main()
