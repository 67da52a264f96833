"""A short history of every table's figures, for the ``/status`` page's plots.

:class:`History` reads each served table's counters once per ``interval``
(plain counts, no lock: microseconds per table) and the request latency
histograms of :class:`~tdreplay.service.metrics.Metrics`, and keeps the last
``points`` readings per table in a ring: fill level, insert and sample rates,
samples per insert with the band the rate limiter allows, seconds blocked
per second, and sample / extend latency p50 and p99 over the interval. The
ring is bounded (``points`` per table, tables that are deleted dropped), so
the history costs the same after a week as after a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..metrics import LATENCY_BUCKETS, Metrics

if TYPE_CHECKING:
    from ..core import TableHandle

#: the columns of a table's history, in the order the page reads them
COLUMNS = (
    "t",  # Unix time of the reading
    "fill",  # size / capacity
    "size",
    "insert_rate",  # items inserted per second over the interval
    "sample_rate",
    "spi",  # samples per insert so far
    "spi_low",  # the band the rate limiter allows now
    "spi_high",
    "blocked_insert",  # seconds calls spent held back, per second
    "blocked_sample",
    "sample_p50",  # seconds; None when no such request in the interval
    "sample_p99",
    "extend_p50",
    "extend_p99",
)
#: the ops whose latency the history keeps, and their column prefix
LATENCY_OPS = {"sample": "sample", "extend": "extend"}


def quantile(q: float, counts: list[float]) -> float | None:
    """The ``q`` quantile of a histogram of :data:`LATENCY_BUCKETS` (cumulative ``counts``,
    the last for ``+Inf``), interpolated in its bucket as Prometheus' ``histogram_quantile``."""
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    below, lower = 0.0, 0.0
    for upper, count in zip(LATENCY_BUCKETS, counts, strict=False):
        if count >= rank:
            width = count - below
            return lower + (upper - lower) * ((rank - below) / width if width else 1.0)
        below, lower = count, upper
    return LATENCY_BUCKETS[-1]


class History:
    """The last ``points`` readings of every served table, one every ``interval`` seconds.

    Args:
        metrics: the app's metrics (request latency histograms; told of deleted tables).
        handles: the served tables, now.
        interval: seconds between readings.
        points: readings kept per table.
    """

    def __init__(
        self,
        metrics: Metrics,
        handles: Callable[[], Iterable[TableHandle]],
        *,
        interval: float = 1.0,
        points: int = 600,
    ) -> None:
        self.metrics = metrics
        self.handles = handles
        self.interval = interval
        self.points = points
        self.rings: dict[str, deque[tuple[Any, ...]]] = {}
        self._last: dict[str, tuple[Any, ...]] = {}  # previous counters, by table
        self._latency: dict[tuple[str, str], list[float]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="tdreplay-status-history")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(self.interval)

    def tick(self) -> None:
        """Take one reading of every served table (on the event loop: counters only)."""
        now, mono = time.time(), time.monotonic()
        latency = self.metrics.latency_buckets()
        served = set()
        for handle in list(self.handles()):
            name, t = handle.name, handle.table
            served.add(name)
            rl = t.rate_limiter
            counts = (mono, rl.inserts, rl.samples, rl.blocked("insert"), rl.blocked("sample"))
            before = self._last.get(name)
            self._last[name] = counts
            if before is None or counts[0] <= before[0]:
                continue  # rates need two readings
            dt = counts[0] - before[0]
            # a table replaced by a restore starts its counters anew: no negative rates
            insert_rate, sample_rate, blocked_i, blocked_s = (
                max(0.0, (a - b) / dt) for a, b in zip(counts[1:], before[1:], strict=True)
            )
            spi: float | None = None
            band: tuple[float | None, float | None] = (None, None)
            if rl.inserts:
                spi = rl.samples / rl.inserts
                if rl.samples_per_insert is not None:
                    band = (
                        _finite(rl.samples_per_insert - rl.max_diff / rl.inserts),
                        _finite(rl.samples_per_insert - rl.min_diff / rl.inserts),
                    )
            quantiles = []
            for op in LATENCY_OPS:
                cumulative = latency.get((name, op))
                prior = self._latency.get((name, op))
                if cumulative is not None:
                    self._latency[(name, op)] = cumulative
                delta = (
                    [max(0.0, a - b) for a, b in zip(cumulative, prior, strict=True)]
                    if cumulative is not None and prior is not None
                    else cumulative or []
                )
                quantiles += [quantile(0.5, delta), quantile(0.99, delta)]
            size = t.size
            row = (
                now,
                size / max(t.capacity, 1),
                size,
                insert_rate,
                sample_rate,
                spi,
                *band,
                blocked_i,
                blocked_s,
                *quantiles,
            )
            self.rings.setdefault(name, deque(maxlen=self.points)).append(row)
        for name in set(self._last) - served:  # deleted
            self._last.pop(name, None)
            self.rings.pop(name, None)
            for op in LATENCY_OPS:
                self._latency.pop((name, op), None)

    def series(self, name: str) -> dict[str, list[Any]]:
        """Table ``name``'s history as columns (:data:`COLUMNS`), oldest first."""
        rows = list(self.rings.get(name, ()))
        return {col: [row[i] for row in rows] for i, col in enumerate(COLUMNS)}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
