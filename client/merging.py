"""How a sharded client joins what its servers answer and splits what it asks of them
(pure functions, no I/O: the plans use them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def merge_infos(
    infos: list[dict[str, Any]], down: dict[int, dict[str, str]] | None = None
) -> dict[str, Any]:
    """One info for a table sharded over servers: sizes and counters summed, ``shards`` listed.

    ``down`` (an ``info`` that went on without servers that did not answer): those servers
    by shard number, each ``{"url", "error"}``; the sums are of the servers that answered
    (what can be sampled now), and ``down`` lists the rest.

        >>> merged = merge_infos([{"size": 3}, {"size": 4}])
        >>> merged["size"], len(merged["shards"])
        (7, 2)
        >>> merge_infos([{"size": 3}], down={1: {"url": "http://b", "error": "timed out"}})["down"]
        [{'shard': 1, 'url': 'http://b', 'error': 'timed out'}]
    """
    if len(infos) == 1 and not down:
        return infos[0]
    out = dict(infos[0])
    for key in ("size", "capacity", "inserts", "samples", "bytes_in", "bytes_out"):
        if all(isinstance(i.get(key), int | float) for i in infos):
            out[key] = sum(i[key] for i in infos)
    for key in ("can_sample", "can_insert"):
        if all(key in i for i in infos):
            out[key] = any(bool(i[key]) for i in infos)
    out["shards"] = infos
    if down:
        out["down"] = [{"shard": k, **v} for k, v in sorted(down.items())]
    return out


def split_batch(
    batch_size: int, sizes: Sequence[int], unit: int = 1, generator: torch.Generator | None = None
) -> list[int]:
    """Items to draw from each server: a multinomial split in proportion to ``sizes``.

    Drawn in whole ``unit`` (slice length) pieces. When every server is empty
    the whole batch goes to one of them, chosen at random, where the rate
    limiter makes it wait for data.

        >>> split_batch(8, [0, 5])
        [0, 8]
        >>> sum(split_batch(64, [3, 1], unit=4)) == 64
        True
    """
    if batch_size % unit:
        raise ValueError(f"batch size {batch_size} is not a multiple of slice length {unit}")
    pieces = batch_size // unit
    weights = torch.tensor([max(0, s) for s in sizes], dtype=torch.float64)
    if weights.sum() <= 0:
        weights = torch.ones(len(sizes), dtype=torch.float64)
        pick = int(torch.randint(len(sizes), (1,), generator=generator))
        counts = [0] * len(sizes)
        counts[pick] = pieces
        return [c * unit for c in counts]
    drawn = torch.multinomial(weights, pieces, replacement=True, generator=generator)
    counts = torch.bincount(drawn, minlength=len(sizes)).tolist()
    return [c * unit for c in counts]


def by_shard(
    index: torch.Tensor, n: int, *columns: torch.Tensor | None
) -> list[tuple[int, torch.Tensor, list[torch.Tensor | None]]]:
    """A sharded ``index`` (``slot * n + server``, as samples give it) split by server:
    ``(server, its slots, the rows of each of columns that go with them)`` for every
    server it names, in server order (``None`` columns stay ``None``).

        >>> [(s, i.tolist()) for s, i, _ in by_shard(torch.tensor([4, 3, 6]), 2)]
        [(0, [2, 3]), (1, [1])]
    """
    shard = index % n
    out = []
    for s in range(n):
        mine = shard == s
        if bool(mine.any()):
            out.append((s, index[mine] // n, [None if c is None else c[mine] for c in columns]))
    return out
