"""What a redis table costs in Redis memory, and how fast rows go into it as its strings grow.

A ``redis-server`` of its own (no persistence, in a scratch folder deleted at the end),
tables made in this process with ``Table.create`` (the storage API: Redis is what is
measured, not HTTP).

* **Redis memory**: ``INFO memory`` ``used_memory`` over the empty server, after creating a
  1M-row table of the shipped cartpole schema, and after 1,000 and 100,000 rows; then
  ``sample(256)`` from it (items/s, the median of the rounds).
* **extend into a growing string**: a table of one 28,224-byte frame field (84x84x4 uint8)
  and an id, 64 rows an extend, until the frame string is ``--mb`` MB (300 by default):
  rows/s of the first and last tenth of the fill, seconds to create and fill, and the
  CPU seconds Redis spent on it (``INFO cpu``: what the host's other load disturbs
  least), lazily grown (the default) and with ``preallocate`` (whole at create),
  interleaved round by round; the median of the rounds. Redis grows a string with
  ``realloc`` as ``SETRANGE`` writes past its end: a copy per write would make the last
  tenth far slower than the first.

    python bench/redis_bench.py            # 5 rounds
    python bench/redis_bench.py --quick    # 2 rounds, 100 MB
Writes bench/results/redis.json (``--json FILE`` elsewhere).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import torch
import yaml
from tensordict import TensorDict

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from common import entry, free_port, print_entries, write_json  # noqa: E402

from tdreplay.storage import Table, TableSpec  # noqa: E402

MB = 1e6
FRAME = 84 * 84 * 4
BATCH = 64


def start_redis(folder: Path) -> tuple[subprocess.Popen, redis.Redis, str]:
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("redis-server is not installed")
    port = free_port()
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*args, "--dir", str(folder)], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_timeout=60)
    for _ in range(500):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    return proc, client, f"redis://127.0.0.1:{port}/0"


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def cartpole_rows(spec: TableSpec, start: int, n: int) -> dict[tuple[str, ...], torch.Tensor]:
    return {
        k: torch.full([n, *shape], start % 7, dtype=dtype)
        for k, (shape, dtype) in spec.torch_schema().items()
    }


def memory(client: redis.Redis, url: str, root: Path, rounds: int) -> list[dict[str, Any]]:
    data = yaml.safe_load((REPO / "schemas" / "cartpole.yaml").read_text())
    data.update(capacity=1_000_000, backend={"kind": "redis"})
    spec = TableSpec.parse(data)
    base = used(client)
    table = Table.create(spec, root, redis={"default": url})
    out = [
        entry(
            "redis",
            "Redis used_memory, empty 1M-row cartpole table",
            (used(client) - base) / MB,
            "MB",
        )
    ]
    done = 0
    for n in (1_000, 100_000):
        while done < n:
            step = min(10_000, n - done)
            table.extend(cartpole_rows(spec, done, step))
            done += step
        grown = (used(client) - base) / MB
        out.append(
            entry(
                "redis",
                f"Redis used_memory, {n:,} cartpole rows ({spec.item_nbytes} B each)",
                grown,
                "MB",
            )
        )
    rates = []
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(200):
            table.sample(256)
        rates.append(200 * 256 / (time.perf_counter() - began))
    rate = statistics.median(rates)
    out.append(entry("redis", "sample 256, 100,000 cartpole rows", rate, "items/s"))
    table.destroy()
    return out


@dataclass
class Fill:
    """One create-and-fill: wall seconds (create, fill), Redis CPU seconds (the same),
    and rows/s of each tenth of the fill."""

    create: float
    fill: float
    create_cpu: float
    fill_cpu: float
    tenths: list[float]


def redis_cpu(client: redis.Redis) -> float:
    """CPU seconds the Redis server has used (its own, whatever else runs on the host)."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def fill(client: redis.Redis, url: str, root: Path, rows: int, whole: bool) -> Fill:
    spec = TableSpec.model_validate(
        {
            "name": "frames",
            "capacity": rows,
            "backend": {"kind": "redis"},
            "fields": {
                "id": {"shape": [], "dtype": "int64"},
                "frame": {"shape": [FRAME], "dtype": "uint8"},
            },
        }
    )
    batch = TensorDict(
        {"id": torch.arange(BATCH), "frame": torch.ones(BATCH, FRAME, dtype=torch.uint8)}, [BATCH]
    )
    cpu, began = redis_cpu(client), time.perf_counter()
    table = Table.create(spec, root, redis={"default": url}, preallocate=whole)
    created, created_cpu = time.perf_counter() - began, redis_cpu(client) - cpu
    cpu = redis_cpu(client)
    times = []
    for _ in range(rows // BATCH):
        t = time.perf_counter()
        table.extend(batch)
        times.append(time.perf_counter() - t)
    filled_cpu = redis_cpu(client) - cpu
    table.destroy()
    tenth = len(times) // 10
    rates = [BATCH * tenth / sum(times[i * tenth : (i + 1) * tenth]) for i in range(10)]
    return Fill(created, sum(times), created_cpu, filled_cpu, rates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--mb", type=float, default=None, help="the frame string's size at the end")
    p.add_argument("--json", type=Path, default=HERE / "results" / "redis.json")
    args = p.parse_args()
    rounds = 2 if args.quick else 5
    rows = int((args.mb or (100 if args.quick else 300)) * MB) // FRAME // BATCH * BATCH
    scratch = Path(tempfile.mkdtemp(prefix="tdreplay-redis-bench-"))
    proc, client, url = start_redis(scratch)
    try:
        entries = memory(client, url, scratch, rounds)
        got: dict[bool, list[Fill]] = {False: [], True: []}
        for _ in range(rounds):
            for whole in (False, True):
                got[whole].append(fill(client, url, scratch, rows, whole))
        size = rows * FRAME / MB
        for whole in (False, True):
            how = "preallocated" if whole else "lazily grown"
            runs = got[whole]
            for name, unit, value in (
                ("create", "s", statistics.median(f.create for f in runs)),
                *(
                    (f"extend {BATCH} frames, {part} tenth", "rows/s", statistics.median(rates))
                    for part, rates in (
                        ("first", [f.tenths[0] for f in runs]),
                        ("last", [f.tenths[-1] for f in runs]),
                    )
                ),
                ("create and fill", "s", statistics.median(f.create + f.fill for f in runs)),
                (
                    "Redis CPU, create and fill",
                    "s",
                    statistics.median(f.create_cpu + f.fill_cpu for f in runs),
                ),
            ):
                entries.append(entry("redis", f"{name}, {size:.0f} MB string, {how}", value, unit))
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(scratch, ignore_errors=True)
    print_entries(entries)
    write_json(args.json, "redis", entries, rounds=rounds, rows=rows)


if __name__ == "__main__":
    main()
