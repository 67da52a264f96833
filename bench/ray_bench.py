"""TorchRL's ``RayCollector`` writing into ``TDReplayBuffer``, next to TorchRL's own buffers.

    python bench/ray_bench.py                 # ~5 min on 2 cores: 3 rounds of 20,000 frames
    python bench/ray_bench.py --quick         # ~1 min: 1 round of 4,000 frames
    python bench/ray_bench.py --json bench/results/ray.json

Two remote collectors (Ray actors, one CPU each, CartPole-v1, a random
policy, ``sync=True``: every round one 100-frame batch per actor, so every
frame counted is stored and none is in flight at the end) collect ``--frames``
frames into, case by case:

* ``tdreplay``: ``replay_buffer=TDReplayBuffer(url, table, create=...)``; each
  actor extends the table over its own connection (shared memory on this host).
* ``torchrl ray buffer``: ``replay_buffer=TensorDictReplayBuffer(storage=
  partial(LazyTensorStorage, N), service_backend="ray")``, TorchRL's
  ``RayReplayBuffer``: an actor holds the storage, the collectors extend it through Ray.
* ``torchrl in-process``: no ``replay_buffer``; each batch comes back to the
  driver through Ray's object store and the driver extends
  ``TensorDictReplayBuffer(storage=LazyTensorStorage(N))`` (``RayCollector``
  refuses an in-process buffer as ``replay_buffer=``).

frames/s is the frames stored over the seconds from the first iteration to the
last (starting the actors is reported apart: ``start s``). Each case once per
round, in a rotating order; medians over rounds, ratios the median of the
per-round ratios. One server (``python -m tdreplay.service serve``, a temporary
root) and a local Ray runtime (2 CPUs, no dashboard, every port on loopback:
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, Ray's one-host mode). Without ``ray``
installed it says so and exits 0 (skipped).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported

from common import entry, free_port, machine, print_entries, stop, wait_up, write_json
from workers import paired_ratio, rotate

try:
    import ray
except ImportError as err:
    ray = None
    RAY_ERR: ImportError | None = err
else:
    RAY_ERR = None

COLLECTORS = 2
FRAMES_PER_BATCH = 200  # per round, split between the actors (sync=True)
CAPACITY = 100_000
CASES = ("tdreplay", "torchrl ray buffer", "torchrl in-process")


def make_env() -> Any:
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


def run_case(case: str, frames: int, url: str, n: int) -> dict[str, float]:
    """One collection of ``frames`` frames into ``case``'s buffer: start and collect seconds."""
    from tensordict import TensorDictBase
    from torchrl.collectors import Collector
    from torchrl.collectors.distributed import RayCollector
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from tdreplay.torchrl import TDReplayBuffer

    rb: Any
    given: Any = None
    if case == "tdreplay":
        rb = given = TDReplayBuffer(url, f"ray_bench_{n}", create={"capacity": CAPACITY})
    elif case == "torchrl ray buffer":
        rb = given = TensorDictReplayBuffer(
            storage=partial(LazyTensorStorage, CAPACITY),
            service_backend="ray",
            service_backend_options={"remote_config": {"num_cpus": 0}},
        )
    else:
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(CAPACITY))
    started = time.perf_counter()
    collector = RayCollector(
        [make_env] * COLLECTORS,
        policy=None,
        collector_class=Collector,
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=frames,
        sync=True,
        replay_buffer=given,
        remote_configs={"num_cpus": 1, "memory": 256 * 1024**2},
    )
    ready = time.perf_counter()
    try:
        for out in collector:
            if isinstance(out, TensorDictBase):
                rb.extend(out.reshape(-1))
    finally:
        collector.shutdown()
    done = time.perf_counter()
    stored = len(rb)
    if case == "torchrl ray buffer":
        rb.shutdown()
    if stored != frames:
        raise RuntimeError(f"{case}: {stored} frames stored, {frames} collected")
    return {
        "start_s": ready - started,
        "seconds": done - ready,
        "frames_per_s": stored / (done - ready),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 round of 4,000 frames")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--frames", type=int, default=20_000, help="per case and round")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    args = p.parse_args(argv)
    if ray is None:
        print(f"skipped: ray is not installed (pip install 'tdreplay[ray]'): {RAY_ERR}")
        return 0
    if args.quick:
        args.rounds, args.frames = 1, 4_000
    warnings.filterwarnings("ignore", message="The policy is not an nn.Module")
    warnings.filterwarnings("ignore", message="RayCollector iteration started before")
    info = machine()
    info["loadavg_start"] = info.pop("loadavg")
    t_start = time.perf_counter()
    runs: dict[str, list[dict[str, float]]] = {case: [] for case in CASES}
    procs: list[subprocess.Popen] = []
    temp = tempfile.mkdtemp(prefix="tdr-ray-bench-")  # short: Ray's socket paths
    try:
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "tdreplay.service", "serve", "--root", f"{temp}/data",
             "--port", str(port), "--log-level", "warning"],
        )  # fmt: skip
        procs.append(server)
        url = f"http://127.0.0.1:{port}"
        wait_up(f"{url}/readyz", server, "tdreplay server")
        started = time.perf_counter()
        ray.init(
            num_cpus=COLLECTORS,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=f"{temp}/ray",
            object_store_memory=200 * 1024**2,
            log_to_driver=False,
        )
        info["ray_start_s"] = time.perf_counter() - started
        print(f"# ray bench: {args.rounds} rounds of {args.frames:,} frames per case; "
              f"ray started in {info['ray_start_s']:.1f} s; {info['cores']} cores, {info['cpu']}",
              flush=True)  # fmt: skip
        for r in range(args.rounds):
            for case in rotate(list(CASES), r):
                run = run_case(case, args.frames, url, len(runs["tdreplay"]))
                runs[case].append(run)
                print(f"  round {r}: {case}: start {run['start_s']:.1f} s, "
                      f"{run['frames_per_s']:,.0f} frames/s", flush=True)  # fmt: skip
    finally:
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        stop(procs)
        shutil.rmtree(temp, ignore_errors=True)
    info["loadavg_end"] = list(os.getloadavg())

    def med(case: str, key: str = "frames_per_s") -> float:
        return statistics.median(run[key] for run in runs[case])

    ours = f"RayCollector({COLLECTORS} actors) -> TDReplayBuffer"
    figures = [
        entry("ray", ours, med("tdreplay"), "frames/s", base, med(base),
              ratio=paired_ratio(runs["tdreplay"], runs[base], "frames_per_s"))
        for base in CASES[1:]
    ] + [
        entry("ray", f"start {COLLECTORS} collector actors ({case})", med(case, "start_s"), "s")
        for case in CASES
    ] + [entry("ray", "ray.init (local, loopback)", info["ray_start_s"], "s")]  # fmt: skip
    print_entries(figures)
    wall = time.perf_counter() - t_start
    print(f"\n{wall:.0f}s")
    if args.json:
        write_json(args.json, "ray", figures, machine=info, quick=args.quick,
                   rounds=args.rounds, frames=args.frames, runs=runs, wall_s=wall)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
