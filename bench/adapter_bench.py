"""The TorchRL adapter's own cost: ``TDReplayBuffer.sample`` / ``extend`` next to the bare client's.

    python bench/adapter_bench.py                 # full run (~1 min): 5 rounds of 1.5 s per case
    python bench/adapter_bench.py --quick         # ~15 s: 2 rounds of 0.5 s
    python bench/adapter_bench.py --json bench/results/adapter.json

A TorchRL script that swaps its buffer for ``TDReplayBuffer`` pays, on top of
the client's call, what the adapter adds: TorchRL's sampling conventions (a
batch that owns its memory, ``priority_weight`` from a prioritized table), the
transforms' hooks, and on extend the table's keys picked out of the caller's
TensorDict (left unchanged, as TorchRL leaves it). Each case here is the
adapter's call and, in the same run, interleaved, the bare client's call with
the same batch on the same transport: ``client.sample(table, 128, owned=True)``
(a batch that owns its memory, as TorchRL's sample gives; over shared memory
the slot copied once) and ``client.extend(table, rows)`` of 1,000 rows (a DQN
collector's batch). Goal (issue: adapter overhead): the ratio adapter / client
>= 1/1.2. One more row, with no goal, sets the owned batch against the
client's fastest way, ``client.sample(table, 128)`` viewing a leased
shared-memory slot: what owning the memory costs.

One server (``python -m tdreplay.service serve``, one torch thread, the shipped
schemas, memmap) and one client process (one torch thread); figures are
medians over rounds, ratios the median of per-round ratios.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from common import entry
from workers import Case, median_of, one_server_main, paired_ratio

TABLE = "cartpole"
SAMPLE = 128
EXTEND = 1000
#: the adapter's calls may take this much longer than the bare client's
GOAL = 1 / 1.2


def make_cases(cfg: dict[str, Any]) -> dict[str, Case]:
    """``{tr}: {who} sample b128`` and ``{tr}: {who} extend b1000``, who = adapter or client."""
    import torch
    from tdreplay_cases import rows

    from tdreplay.client import ReplayClient
    from tdreplay.torchrl import TDReplayBuffer

    torch.set_num_threads(1)
    fields = {k: (s, d) for k, (s, d) in cfg["fields"][TABLE].items()}
    batch = rows(fields, EXTEND, seed=1)
    cases: dict[str, Case] = {}
    for tr in cfg["transports"]:
        client = ReplayClient(cfg["url"], transport=tr, timeout=120)
        if client.transport != tr:
            raise RuntimeError(f"asked for transport {tr!r}, got {client.transport!r}")
        client.extend(TABLE, batch)  # something to sample from
        rb = TDReplayBuffer(client, TABLE, batch_size=SAMPLE)
        cases[f"{tr}: client sample b{SAMPLE}"] = Case(
            lambda c=client: c.sample(TABLE, SAMPLE, owned=True), SAMPLE
        )
        cases[f"{tr}: client owned sample b{SAMPLE}"] = cases[f"{tr}: client sample b{SAMPLE}"]
        cases[f"{tr}: client leased sample b{SAMPLE}"] = Case(
            lambda c=client: c.sample(TABLE, SAMPLE), SAMPLE
        )
        cases[f"{tr}: adapter sample b{SAMPLE}"] = Case(lambda rb=rb: rb.sample(), SAMPLE)
        cases[f"{tr}: client extend b{EXTEND}"] = Case(
            lambda c=client: c.extend(TABLE, batch), EXTEND
        )
        cases[f"{tr}: adapter extend b{EXTEND}"] = Case(lambda rb=rb: rb.extend(batch), EXTEND)
    return cases


def groups(transports: list[str]) -> list[list[str]]:
    """The adapter and the client back to back; on shm the owned sample and the leased one."""
    pairs = [
        [f"{tr}: adapter {what}", f"{tr}: client {what}"]
        for what in (f"sample b{SAMPLE}", f"extend b{EXTEND}")
        for tr in transports
    ]
    if "shm" in transports:
        pairs.append(
            [f"shm: client owned sample b{SAMPLE}", f"shm: client leased sample b{SAMPLE}"]
        )
    return pairs


def entries(runs: dict[str, list[dict[str, float]]], transports: list[str]) -> list[dict[str, Any]]:
    figures = []
    for what in (f"sample b{SAMPLE}", f"extend b{EXTEND}"):
        for tr in transports:
            ours, base = runs[f"{tr}: adapter {what}"], runs[f"{tr}: client {what}"]
            figures.append(
                entry(
                    "adapter",
                    f"{TABLE} TDReplayBuffer {what} ({tr})",
                    median_of(ours),
                    "items/s",
                    f"ReplayClient {what}{', owned' if 'sample' in what else ''} ({tr})",
                    median_of(base),
                    ratio=paired_ratio(ours, base),
                    goal=GOAL,
                )
            )
    if "shm" in transports:  # the pair run back to back, its own group
        ours = runs[f"shm: client owned sample b{SAMPLE}"]
        base = runs[f"shm: client leased sample b{SAMPLE}"]
        figures.append(
            entry(
                "adapter",
                f"{TABLE} ReplayClient sample b{SAMPLE}, owned (shm)",
                median_of(ours),
                "items/s",
                f"ReplayClient sample b{SAMPLE}, leased slot (shm)",
                median_of(base),
                ratio=paired_ratio(ours, base),
            )
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    script = Path(__file__).resolve()
    return one_server_main(argv, __doc__, "adapter", script, make_cases, groups, entries)


if __name__ == "__main__":
    sys.exit(main())
