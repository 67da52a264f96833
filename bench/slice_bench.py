"""Slice sampler cost: the sampler alone, and ``Table.sample`` of a slice table.

Not a test: it prints medians of thread CPU time with one torch thread::

    python bench/slice_bench.py                 # 1M and 30M slots
    python bench/slice_bench.py --capacity 1e6

The sampler alone is driven as a table drives it: ring inserts of 16,384 items
(episodes of 1,000 steps) evict and insert, then ``sample(256)`` of
``slice_len`` 8 is timed (median of 200 calls) between inserts, over 11
rounds; the figures are the medians over rounds. ``Table.sample(256)`` is timed
on a full ``memory`` table of 1M small items.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from tensordict import TensorDict

from tdreplay.storage import Table, TableSpec
from tdreplay.storage.samplers import SliceSampler
from tdreplay.storage.slots import Slots

CHUNK, SLICE_LEN, EPISODE, ROUNDS = 16_384, 8, 1_000, 11


def thread_us(fn: Callable[[], object]) -> float:
    began = time.thread_time_ns()
    fn()
    return (time.thread_time_ns() - began) / 1e3


def ring_insert(sampler: SliceSampler, start: int) -> None:
    """Insert ``CHUNK`` items at slot ``start`` on, evicting what they overwrite."""
    slots = sampler.slots
    index = torch.arange(start, start + CHUNK) % slots.capacity
    evicted = index[slots.live[index]]
    if len(evicted):
        slots.live[evicted] = False
        slots.n_live -= len(evicted)
        sampler.on_remove(evicted)
    ordinal = torch.arange(slots.inserted + 1, slots.inserted + CHUNK + 1)
    slots.ordinal[index] = ordinal
    slots.inserted += CHUNK
    episode = (ordinal - 1) // EPISODE
    sampler.before_live(index, episode)
    slots.live[index] = True
    slots.n_live += CHUNK
    sampler.on_insert(index, episode)


def sampler_alone(capacity: int) -> tuple[float, float]:
    """Median µs of ``sample(256)`` and of one ring insert (with its evictions)."""
    sampler = SliceSampler(Slots(capacity), torch.Generator().manual_seed(0), slice_len=SLICE_LEN)
    at = 0
    for _ in range(capacity // CHUNK + 3):  # full, and wrapped
        ring_insert(sampler, at)
        at += CHUNK
    sample, insert = [], []
    for _ in range(ROUNDS):
        sample.append(statistics.median(thread_us(lambda: sampler.sample(256)) for _ in range(200)))
        insert.append(thread_us(lambda at=at: ring_insert(sampler, at)))
        at += CHUNK
    return statistics.median(sample), statistics.median(insert)


def table_sample(capacity: int) -> float:
    """Median µs of ``Table.sample(256)`` on a full slice table."""
    spec = TableSpec.model_validate(
        {
            "name": "slices",
            "capacity": capacity,
            "backend": {"kind": "memory"},
            "fields": {
                "obs": {"shape": [4], "dtype": "float32"},
                "ep": {"shape": [], "dtype": "int64"},
            },
            "sampler": {"kind": "slice", "slice_len": SLICE_LEN, "traj_key": "ep", "end_key": None},
        }
    )
    table = Table.create(spec, seed=0)
    for at in range(0, capacity + 3 * CHUNK, CHUNK):
        ids = torch.arange(at, at + CHUNK)
        table.extend(TensorDict({"obs": torch.zeros(CHUNK, 4), "ep": ids // EPISODE}, [CHUNK]))
    rounds = [
        statistics.median(thread_us(lambda: table.sample(256)) for _ in range(200))
        for _ in range(ROUNDS)
    ]
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=float, action="append", help="slots (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for capacity in [int(c) for c in args.capacity or [1e6, 30e6]]:
        sample, insert = sampler_alone(capacity)
        print(
            f"capacity {capacity:>11,}: sampler sample(256) {sample:6.1f} us, "
            f"ring insert of {CHUNK:,} {insert / 1e3:6.3f} ms"
        )
    print(f"capacity   1,000,000: Table.sample(256) {table_sample(1_000_000):6.1f} us")


if __name__ == "__main__":
    main()
