"""``Slots.tagged``: the newest inserts' slots by tag, found without sorting every item."""

from __future__ import annotations

import pytest
import torch

from tdreplay.storage.slots import Slots


def reference(s: Slots, limit: int) -> dict[int, list[int]]:
    """The definition, by brute force: live tagged slots in insert order, runs of one tag,
    the newest ``limit`` tags (a tag seen twice: its newest run)."""
    slots = sorted((int(s.ordinal[i]), i) for i in range(s.capacity) if s.live[i] and s.tag[i])
    runs: list[tuple[int, list[int]]] = []
    for _, i in slots:
        tag = int(s.tag[i])
        if runs and runs[-1][0] == tag:
            runs[-1][1].append(i)
        else:
            runs.append((tag, [i]))
    out: dict[int, list[int]] = {}
    for tag, group in reversed(runs):
        if len(out) == limit:
            break
        out.setdefault(tag, group)
    return out


@pytest.mark.parametrize(
    ("sizes", "limit"),
    [((1, 3), 5), ((50, 200), 2), ((1, 400), 3), ((2, 9), 10_000), ((1, 2), 7), ((100, 300), 6)],
)
def test_tagged_matches_its_definition(sizes: tuple[int, int], limit: int) -> None:
    g = torch.Generator().manual_seed(sum(sizes) + limit)
    s = Slots(4096)
    ordinal, cursor = 1, 0
    while ordinal <= 12_000:  # a ring that wrapped: ordinals are not in slot order
        n = int(torch.randint(sizes[0], sizes[1] + 1, (1,), generator=g))
        tag = int(torch.randint(0, 8, (1,), generator=g))  # 0: no tag; tags come back often
        for _ in range(n):
            s.ordinal[cursor], s.tag[cursor], s.live[cursor] = ordinal, tag, True
            ordinal, cursor = ordinal + 1, (cursor + 1) % s.capacity
    s.hi = s.capacity  # every slot written (the ring wrapped): hi as a table keeps it
    s.live[torch.randperm(s.capacity, generator=g)[:300]] = False  # some removed
    got = {t: v.tolist() for t, v in s.tagged(limit).items()}
    assert got == reference(s, limit)
    assert list(got) == list(reference(s, limit))  # the newest first
