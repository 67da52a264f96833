"""The slice sampler draws as TorchRL's ``SliceSampler`` does: a trajectory uniformly among
those that hold a slice, then a start uniformly inside it; and the trajectory edges it keeps
incrementally match a full scan of the table."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict
from testkit import make_spec, rows
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SliceSampler

from tdreplay.storage.samplers.ranks import CountedMask

EPISODE = {"ep": {"shape": [], "dtype": "int64"}}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def chi2_999(df: int) -> float:
    """The 99.9% quantile of the chi-square distribution with ``df`` degrees of freedom."""
    lo, hi = 0.0, 10.0 * df + 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        cdf = torch.special.gammainc(torch.tensor(df / 2), torch.tensor(mid / 2))
        lo, hi = (mid, hi) if cdf < 0.999 else (lo, mid)
    return lo


def slice_table(tables, capacity: int, slice_len: int, seed: int = 0, **extra):
    sampler = {"kind": "slice", "slice_len": slice_len, "traj_key": "ep", "end_key": None}
    spec = make_spec(capacity=capacity, fields=EPISODE, sampler=sampler, **extra)
    return tables.create(spec, seed=seed)


def episodes(lengths: list[int], start: int = 0) -> TensorDict:
    ep = torch.cat([torch.full((n,), e, dtype=torch.int64) for e, n in enumerate(lengths)])
    data = rows(start, len(ep))
    data["ep"] = ep
    return data


def test_trajectories_are_drawn_uniformly_as_torchrl_draws_them(tables) -> None:
    """Episodes of 3, 10, 1000 and 40 steps, slices of 5: TorchRL's SliceSampler (default
    strict_length=True) never draws the 3-step one and each other one a third of the time,
    however long; tdreplay drew starts uniformly, the 1000-step episode 96% of the time."""
    lengths, slice_len, calls, per_call = [3, 10, 1000, 40], 5, 30, 400
    data = episodes(lengths)
    expected = torch.full((3,), 1 / 3, dtype=torch.float64)

    table = slice_table(tables, 2048, slice_len)
    table.extend(data)
    ours = torch.zeros(4, dtype=torch.float64)
    for _ in range(calls):
        first = table.sample(slice_len * per_call)["ep"].reshape(-1, slice_len)[:, 0]
        ours += torch.bincount(first, minlength=4)

    rb = ReplayBuffer(
        storage=LazyTensorStorage(2048), sampler=SliceSampler(slice_len=slice_len, traj_key="ep")
    )
    rb.extend(data)
    theirs = torch.zeros(4, dtype=torch.float64)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        for _ in range(calls):
            first = rb.sample(slice_len * per_call)["ep"].reshape(-1, slice_len)[:, 0]
            theirs += torch.bincount(first, minlength=4)

    for counts in (theirs, ours):
        assert counts[0] == 0, counts  # shorter than a slice: never drawn
        assert chi_square(counts[1:], expected) < chi2_999(2), counts


def test_starts_are_uniform_inside_each_trajectory_across_the_ring_end(tables) -> None:
    """A 20-slot ring holding items 6..25: episodes of 4 (items 6-9), 7 (10-16), 7 (17-23, slots
    17..19 then 0..3) and 2 steps. Slices of 3: each of the three that hold one is drawn a
    third of the time and its starts alike; the same seed draws the same slices."""
    lengths = [6, 4, 7, 7, 2]
    starts = {1: range(6, 8), 2: range(10, 15), 3: range(17, 22)}
    probs = torch.tensor([1 / 3 / len(r) for r in starts.values() for _ in r], dtype=torch.float64)
    position = {s: i for i, s in enumerate(s for r in starts.values() for s in r)}

    def draw(seed: int) -> torch.Tensor:
        table = slice_table(tables, 20, 3, seed=seed, name=f"ring{seed}")
        data = episodes(lengths)
        table.extend(data[:14])
        table.extend(data[14:])  # wraps: items 0..5 overwritten
        return torch.cat([table.sample(18)["id"].reshape(-1, 3) for _ in range(1500)])

    slices = draw(3)
    assert torch.equal(slices - slices[:, :1], torch.arange(3).expand_as(slices))
    counts = torch.bincount(
        torch.tensor([position[s] for s in slices[:, 0].tolist()]), minlength=len(position)
    ).double()
    assert chi_square(counts, probs) < chi2_999(len(position) - 1), counts
    assert torch.equal(draw(3), slices)


def brute_force_edges(sampler) -> tuple[list[bool], list[bool]]:
    """Each slot: the first valid start of its trajectory (a head), the last (a tail)."""
    s, cap, k = sampler.slots, sampler.slots.capacity, sampler.slice_len
    live, ordinal, episode = s.live.tolist(), s.ordinal.tolist(), sampler.episode.tolist()

    def link(a: int) -> bool:
        b = (a + 1) % cap
        return live[a] and live[b] and ordinal[b] - ordinal[a] == 1 and episode[b] == episode[a]

    valid = [
        live[a] and ordinal[a] > 0 and all(link((a + i) % cap) for i in range(k - 1))
        for a in range(cap)
    ]
    cont = [valid[a] and valid[(a + 1) % cap] and link(a) for a in range(cap)]
    return (
        [valid[a] and not cont[(a - 1) % cap] for a in range(cap)],
        [valid[a] and not cont[a] for a in range(cap)],
    )


def test_trajectory_edges_kept_incrementally_match_a_full_scan(tables) -> None:
    """Random extends (episodes of random lengths, ring wraps), samples that remove items
    (max_times_sampled splits trajectories), every capacity and slice length small."""
    g = torch.Generator().manual_seed(0)

    def rand(hi: int) -> int:
        return int(torch.randint(hi, (1,), generator=g))

    for trial in range(30):
        cap = 1 + rand(30)
        slice_len = 1 + rand(min(cap, 5))
        table = slice_table(
            tables, cap, slice_len, seed=trial, name=f"t{trial}", max_times_sampled=rand(3)
        )
        item, ep = 0, 0
        for _ in range(25):
            n = 1 + rand(cap)
            eps = []
            for _ in range(n):
                ep += rand(5) == 0
                eps.append(ep)
            data = rows(item, n)
            data["ep"] = torch.tensor(eps, dtype=torch.int64)
            item += n
            table.extend(data)
            if table.sampler.n_valid and rand(2):
                table.sample(slice_len * (1 + rand(cap // slice_len)))
            heads, tails = brute_force_edges(table.sampler)
            edges = table.sampler.edges.mask.view(-1, 2)
            assert edges[:, 0].tolist() == heads and edges[:, 1].tolist() == tails, trial
            assert table.sampler.edges.count == sum(heads) + sum(tails)


def test_counted_mask_selects_by_rank_as_a_scan_does() -> None:
    """Ranks picked through two levels of block counts (and after unsetting some) are the
    positions a full scan of the mask lists."""
    g = torch.Generator().manual_seed(1)
    mask = CountedMask(300_001)  # 4,688 blocks of 64: two levels of counts
    for _ in range(3):
        index = torch.randperm(300_001, generator=g)[:20_000]
        mask.assign(index, torch.rand(20_000, generator=g) < 0.7)
        scan = mask.mask.nonzero().squeeze(1).numpy()
        assert mask.count == len(scan)
        ranks = np.concatenate([[0, len(scan) - 1], np.arange(0, len(scan), 97)])
        assert (mask.select(ranks) == scan[ranks]).all()
