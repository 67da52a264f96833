"""Every table's figures as Prometheus families, read at scrape time.

What a scrape reads is ``Table.stats`` (see :mod:`tdreplay.storage.table.stats`):
counters as they are, and the scan of the live items (times sampled,
priorities, episodes) on a copy the table takes under its lock. Nothing is
counted per request for these figures. A scrape waits at most
:attr:`TableCollector.wait` seconds for a table's lock (a checkpoint may hold
it); past that it gives the last scan's figures.

Per table (label ``table``):
    ``tdreplay_table_inserts_total``, ``tdreplay_table_samples_total`` (items),
    ``tdreplay_table_bytes_in_total``, ``tdreplay_table_bytes_out_total`` (item bytes),
    ``tdreplay_table_size``, ``tdreplay_table_capacity``, ``tdreplay_table_fill_ratio``,
    ``tdreplay_table_reserved_bytes``, ``tdreplay_table_capacity_bytes`` (rows: held now,
    on disk or in memory, and at capacity),
    ``tdreplay_table_lost``, ``tdreplay_table_unique_sampled_items``,
    ``tdreplay_table_times_sampled_items`` (a gauge histogram over the stored items:
    ``_bucket{le}``, ``_gcount``, ``_gsum``), ``tdreplay_table_trajectories`` (slice
    tables), ``tdreplay_table_priority_{sum,min,max,mean}`` and
    ``tdreplay_table_priority_items`` (prioritized tables; log2 bins),
    ``tdreplay_table_checkpoints_total{outcome}``,
    ``tdreplay_table_checkpoint_{last_success_timestamp_seconds,duration_seconds,bytes}``.
Rate limiter (label ``table``, and ``op`` = insert / sample where it says):
    ``tdreplay_rate_limiter_samples_per_insert`` (so far),
    ``tdreplay_rate_limiter_samples_per_insert_{target,low,high}`` (the band it allows now),
    ``tdreplay_rate_limiter_headroom_items{op}`` (absent: no limit),
    ``tdreplay_rate_limiter_blocked_seconds_total{op}``, ``tdreplay_table_waiting{op}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ..core import TableHandle

C, G, H = CounterMetricFamily, GaugeMetricFamily, GaugeHistogramMetricFamily

#: name -> (kind, help, second label or ""): every family the collector may give
FAMILIES: dict[str, tuple[type, str, str]] = {
    "tdreplay_table_inserts": (C, "Items inserted.", ""),
    "tdreplay_table_samples": (C, "Items sampled.", ""),
    "tdreplay_table_bytes_in": (C, "Item bytes inserted.", ""),
    "tdreplay_table_bytes_out": (C, "Item bytes sampled.", ""),
    "tdreplay_table_size": (G, "Items stored.", ""),
    "tdreplay_table_capacity": (G, "Items the table holds at most.", ""),
    "tdreplay_table_fill_ratio": (G, "size / capacity.", ""),
    "tdreplay_table_reserved_bytes": (
        G,
        "Bytes of rows held now: reserved on disk (memmap, h5: grows in extents) or allocated.",
        "",
    ),
    "tdreplay_table_capacity_bytes": (G, "Bytes of rows at capacity.", ""),
    "tdreplay_table_lost": (
        G,
        "1 when the table's backend lost its data (a Redis restarted empty).",
        "",
    ),
    "tdreplay_table_unique_sampled_items": (G, "Items stored that were sampled at least once.", ""),
    "tdreplay_table_times_sampled_items": (H, "Items stored, by how often each was sampled.", ""),
    "tdreplay_table_trajectories": (G, "Episodes with items stored.", ""),
    "tdreplay_table_priority_sum": (G, "Sum of the stored items' priorities.", ""),
    "tdreplay_table_priority_min": (G, "Least priority of a stored item.", ""),
    "tdreplay_table_priority_max": (G, "Greatest priority of a stored item.", ""),
    "tdreplay_table_priority_mean": (G, "Mean priority of the stored items.", ""),
    "tdreplay_table_priority_items": (H, "Items stored, by priority (log2 bins).", ""),
    "tdreplay_rate_limiter_samples_per_insert": (G, "Items sampled per item inserted, so far.", ""),
    "tdreplay_rate_limiter_samples_per_insert_target": (G, "The ratio the limiter holds to.", ""),
    "tdreplay_rate_limiter_samples_per_insert_low": (G, "Least ratio the limiter allows now.", ""),
    "tdreplay_rate_limiter_samples_per_insert_high": (G, "Greatest ratio it allows now.", ""),
    "tdreplay_rate_limiter_headroom_items": (
        G,
        "Items this side may move before the rate limiter holds it back.",
        "op",
    ),
    "tdreplay_rate_limiter_blocked_seconds": (
        C,
        "Seconds calls spent held back by the rate limiter (waits under way included).",
        "op",
    ),
    "tdreplay_table_waiting": (G, "Calls waiting for the rate limiter now.", "op"),
    "tdreplay_table_checkpoints": (C, "Checkpoints of the table, by outcome.", "outcome"),
    "tdreplay_table_checkpoint_last_success_timestamp_seconds": (
        G,
        "When the last good checkpoint ended (Unix time).",
        "",
    ),
    "tdreplay_table_checkpoint_duration_seconds": (G, "Seconds the last good one took.", ""),
    "tdreplay_table_checkpoint_bytes": (G, "Bytes of the last good checkpoint.", ""),
}


def histogram_buckets(hist: dict[str, Any], integer: bool) -> list[tuple[str, float]]:
    """``(le, cumulative count)`` pairs of a histogram of bins starting at ``hist["edges"]``.

    Integer bins ``[a, b)`` end at ``le = b - 1``; others at ``b`` (a value on a bound
    lands in the bin above it, a difference no plot shows).
    """
    les = [f"{(e - 1 if integer else e):g}" for e in hist["edges"][1:]] + ["+Inf"]
    out, total = [], 0
    for le, count in zip(les, hist["counts"], strict=True):
        total += count
        out.append((le, float(total)))
    return out


def table_samples(name: str, st: dict[str, Any], lost: bool) -> Iterator[tuple[Any, ...]]:
    """``(family, labels, value[, sum])`` for one table's ``stats``."""
    t = [name]
    keys = ("inserts", "samples", "bytes_in", "bytes_out", "size", "capacity")
    for key in (*keys, "reserved_bytes", "capacity_bytes"):
        yield f"tdreplay_table_{key}", t, st[key]
    yield "tdreplay_table_fill_ratio", t, st["size"] / max(st["capacity"], 1)
    yield "tdreplay_table_lost", t, float(lost)
    if st["unique_sampled"] is not None:
        yield "tdreplay_table_unique_sampled_items", t, st["unique_sampled"]
        hist = st["times_sampled"]
        buckets = histogram_buckets(hist, integer=True)
        yield "tdreplay_table_times_sampled_items", t, buckets, hist["sum"]
    if st["trajectories"] is not None:
        yield "tdreplay_table_trajectories", t, st["trajectories"]
    if (p := st["priority"]) is not None:
        for stat in ("sum", "min", "max", "mean"):
            if p[stat] is not None:
                yield f"tdreplay_table_priority_{stat}", t, p[stat]
        yield "tdreplay_table_priority_items", t, histogram_buckets(p, integer=False), p["sum"]
    rl = st["rate_limiter"]
    spi = "tdreplay_rate_limiter_samples_per_insert"
    if rl["samples_per_insert"] is not None:
        yield spi, t, rl["samples_per_insert"]
    if rl["target"] is not None:
        yield f"{spi}_target", t, rl["target"]
    for bound, value in zip(("low", "high"), rl["band"] or (None, None), strict=True):
        if value is not None:
            yield f"{spi}_{bound}", t, value
    for op in ("insert", "sample"):
        yield "tdreplay_table_waiting", [name, op], rl["waiting"][op]
        yield "tdreplay_rate_limiter_blocked_seconds", [name, op], rl["blocked_seconds"][op]
        if rl["headroom"][op] is not None:
            yield "tdreplay_rate_limiter_headroom_items", [name, op], rl["headroom"][op]
    ck = st["checkpoint"]
    for outcome in ("ok", "failed"):
        yield "tdreplay_table_checkpoints", [name, outcome], ck[outcome]
    if ck["last_ok_at"] is not None:
        yield "tdreplay_table_checkpoint_last_success_timestamp_seconds", t, ck["last_ok_at"]
        yield "tdreplay_table_checkpoint_duration_seconds", t, ck["seconds"]
        yield "tdreplay_table_checkpoint_bytes", t, ck["bytes"]


class TableCollector(Collector):
    """Every served table's figures, at each scrape (see the module docstring)."""

    #: seconds a scrape waits for a table's lock before it gives the last scan's figures
    wait = 0.05

    def __init__(self, handles: Callable[[], Iterable[TableHandle]]) -> None:
        self._handles = handles

    def collect(self) -> Iterator[Metric]:
        fams: dict[str, Any] = {}
        for handle in list(self._handles()):
            table = handle.table
            lost = table.backend.state == "lost"
            for name, labels, *value in table_samples(
                handle.name, table.stats(wait=self.wait), lost
            ):
                fam = fams.get(name)
                if fam is None:
                    kind, doc, second = FAMILIES[name]
                    fam = fams[name] = kind(
                        name, doc, labels=["table", second] if second else ["table"]
                    )
                fam.add_metric(labels, *value)
        yield from fams.values()
