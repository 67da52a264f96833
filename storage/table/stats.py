"""A table's figures, Reverb ``TableInfo``-style: counters, limiter state, and per-slot scans.

:func:`limiter_stats` turns the rate limiter's counts into what a person
reads: the samples-per-insert ratio now, the band the limiter keeps it in,
and the headroom each side has before it waits. :func:`scan` reads the
per-slot state (times sampled, priorities, episodes) of a snapshot taken
under the table's lock, and is run *outside* it: a histogram over a million
slots costs tens of milliseconds, which no insert or sample should wait for.

Histograms are lists of bins: ``edges[i]`` is bin ``i``'s lower bound
(inclusive), ``edges[i + 1]`` its upper bound (exclusive); the last bin is
open-ended. Times sampled fall into ``0, 1, 2-3, 4-7, ..., >= 256``;
priorities into ``< 2^-10, [2^-10, 2^-9), ..., >= 2^10``.

    >>> hist = times_histogram(torch.tensor([0, 1, 1, 3, 300]))
    >>> hist["counts"][:4], hist["counts"][-1]
    ([1, 2, 1, 0], 1)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ..rate_limiter import RateLimiter

#: lower bounds of the times-sampled bins (integers: bin ``i`` holds ``[edges[i], edges[i+1])``)
TIMES_EDGES = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
#: lower bounds of the priority bins; the first holds every priority below ``2^-10`` (0 too)
PRIORITY_EDGES = (0.0, *(2.0**k for k in range(-10, 11)))


def times_histogram(times: torch.Tensor) -> dict[str, Any]:
    """Items by how often they were sampled, in the bins of :data:`TIMES_EDGES`."""
    # frexp's exponent of n >= 1 is floor(log2 n) + 1: 1 -> 1, 2..3 -> 2, 4..7 -> 3; of 0 it is 0
    _, exp = torch.frexp(times.to(torch.float32))
    idx = exp.clamp_(0, len(TIMES_EDGES) - 1).to(torch.int64)
    counts = torch.bincount(idx, minlength=len(TIMES_EDGES))
    return {"edges": list(TIMES_EDGES), "counts": counts.tolist()}


def priority_histogram(priority: torch.Tensor) -> dict[str, Any]:
    """Items by priority, in the (log2) bins of :data:`PRIORITY_EDGES`."""
    _, exp = torch.frexp(priority.to(torch.float64))
    # p in [2^k, 2^(k+1)) has exponent k + 1: bin k + 11 for k in [-10, 10)
    idx = (exp.to(torch.int64) + 10).clamp_(0, len(PRIORITY_EDGES) - 1)
    idx = torch.where(priority > 0, idx, torch.zeros_like(idx))
    counts = torch.bincount(idx, minlength=len(PRIORITY_EDGES))
    return {"edges": list(PRIORITY_EDGES), "counts": counts.tolist()}


def distinct(ids: torch.Tensor) -> int:
    """How many distinct values ``ids`` holds (episode ids: increasing, mostly dense)."""
    if not len(ids):
        return 0
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo < 4 * len(ids):  # dense: a mark per id, no sort
        seen = torch.zeros(hi - lo + 1, dtype=torch.bool)
        seen[ids - lo] = True
        return int(seen.sum())
    return int(torch.unique(ids).numel())


def scan(
    times: torch.Tensor, priority: torch.Tensor | None, episode: torch.Tensor | None
) -> dict[str, Any]:
    """The figures read off every live item: ``times``, ``priority`` and ``episode`` are the
    live items' (copies taken under the table's lock).

    Returns:
        ``unique_sampled`` (items sampled at least once), ``times_sampled`` (a histogram
        with ``sum``: the samples the live items account for), ``priority`` (``sum``,
        ``min``, ``max``, ``mean`` and a histogram; ``None`` without priorities) and
        ``trajectories`` (distinct episodes among the items; ``None`` without episodes).
    """
    hist = times_histogram(times)
    hist["sum"] = int(times.sum())
    out: dict[str, Any] = {
        "unique_sampled": int((times > 0).sum()),
        "times_sampled": hist,
        "priority": None,
        "trajectories": None if episode is None else distinct(episode),
    }
    if priority is not None:
        n = len(priority)
        out["priority"] = {
            "sum": float(priority.sum()),
            "min": float(priority.min()) if n else None,
            "max": float(priority.max()) if n else None,
            "mean": float(priority.mean()) if n else None,
            **priority_histogram(priority),
        }
    return out


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def limiter_stats(rl: RateLimiter, size: int) -> dict[str, Any]:
    """The rate limiter's state as figures (the caller holds the table's lock, or reads
    counts that may be a call apart).

    ``samples_per_insert`` is ``samples / inserts`` so far (``None`` before the first
    insert); ``target`` the configured ratio. The limiter keeps
    ``inserts * target - samples`` within ``[min_diff, max_diff]``, which bounds the
    ratio to ``band = [target - max_diff / inserts, target - min_diff / inserts]``
    (narrowing as inserts grow). ``headroom`` is how many more items each side may
    move before it waits (``None``: no limit; sampling also needs
    ``min_size_to_sample`` items). ``blocked_seconds`` sums the time held-back calls
    waited (the waits under way included), ``waits`` counts them, ``waiting`` holds
    them now.
    """
    inserts, samples, spi = rl.inserts, rl.samples, rl.samples_per_insert
    ratio = samples / inserts if inserts else None
    band = None
    head: dict[str, float | None] = {"insert": None, "sample": None}
    if spi is not None:
        diff = inserts * spi - samples
        if inserts:
            band = [_finite(spi - rl.max_diff / inserts), _finite(spi - rl.min_diff / inserts)]
        head["insert"] = max(0.0, (rl.max_diff - diff) / spi) if spi > 0 else None
        head["sample"] = max(0.0, math.floor(diff - rl.min_diff))
    if size < rl.min_size_to_sample:
        head["sample"] = 0.0
        if head["insert"] is not None:  # inserts are free up to the minimum size
            head["insert"] = max(head["insert"], float(rl.min_size_to_sample - size))
    return {
        "samples_per_insert": ratio,
        "target": spi,
        "band": band,
        "error_buffer": rl.error_buffer,
        "min_size_to_sample": rl.min_size_to_sample,
        "headroom": head,
        "blocked_seconds": {op: rl.blocked(op) for op in ("insert", "sample")},
        "waits": {"insert": rl.insert_waits, "sample": rl.sample_waits},
        "waiting": dict(rl.waiting),
        "timeouts": dict(rl.timeouts),
    }


#: what a scan reads under the table's lock: times sampled, priorities, episode ids (live items)
LiveState = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]


#: scans of fewer live items than this are never reused (they cost next to nothing)
CACHED_FROM = 1 << 16


class ScanCache:
    """A table's last scan (:func:`scan`) and the lock of the one under way.

    A scan of :data:`CACHED_FROM` items or more that took over a millisecond of CPU (a large
    table) is reused for 100 times its cost (a million items: a few seconds); any other is
    redone at every call. A caller
    that meets a scan under way waits for it and takes its figures; if that scanner gave
    up (its own wait for the table's lock ran out), the caller scans itself.
    """

    def __init__(self) -> None:
        self.last: tuple[float, float, dict[str, Any]] | None = None  # (when, good for, figures)
        self.running = threading.Lock()

    def figures(
        self, lock: Any, read: Callable[[], LiveState], wait: float | None
    ) -> tuple[dict[str, Any] | None, bool]:
        """The figures, and whether they are current; ``read`` copies the live items' state
        under ``lock`` (the table's), waited for at most ``wait`` seconds (``None``: as long
        as it takes); past them, the last figures (not current), or ``None``."""
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            cached = self.last
            now = time.monotonic()
            if cached is not None and now - cached[0] < cached[1]:
                return cached[2], True
            left = None if deadline is None else max(0.0, deadline - now)
            if self.running.acquire(blocking=False):
                break
            # another thread scans now: its figures will do (a small table's scan is cached
            # for no time at all, so two callers often meet here: the /status history ticks
            # every second)
            if not self.running.acquire(timeout=-1 if left is None else left):
                return _stale(cached)
            self.running.release()
            done = self.last
            if done is not None and done is not cached:
                return done[2], True
            if left == 0.0:
                return _stale(cached)
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not lock.acquire(timeout=-1 if left is None else left):
                return _stale(cached)
            # its cost in this thread's CPU time: a busy machine (the wall clock) must not
            # make a small table's figures stale (seen: unique_sampled 0 after 4 sampled)
            began = time.thread_time()
            try:
                times, priority, episode = read()
            finally:
                lock.release()
            figures = scan(times, priority, episode)
            cost = time.thread_time() - began
            # a small table's scan is redone every time: its figures are exact (its first
            # scan may cost over a millisecond all the same, torch warming up: seen caching
            # an empty table's figures while items came in)
            good_for = min(5.0, 100 * cost) if cost > 0.001 and len(times) >= CACHED_FROM else 0.0
            self.last = (time.monotonic(), good_for, figures)
            return figures, True
        finally:
            self.running.release()


def _stale(
    cached: tuple[float, float, dict[str, Any]] | None,
) -> tuple[dict[str, Any] | None, bool]:
    return (cached[2], False) if cached is not None else (None, False)
