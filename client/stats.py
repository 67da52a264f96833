"""A table's figures as one flat dict of numbers, for a training loop's own logger.

``client.stats(table)`` reads the table's info (its ``stats``, see
``GET /v1/tables/{name}``) and flattens it into TorchRL-style keys, every
value a float, so that any logger takes it as it is::

    for step, batch in enumerate(loader):
        ...
        if step % 100 == 0:
            for key, value in client.stats("replay").items():
                logger.log_scalar(key, value, step=step)

A key is left out where it has no value (no priorities, no episodes, no
checkpoint yet, no rate-limiter target). With several servers the figures
are merged: counts and sums added, the least minimum and greatest maximum
kept, ratios and means computed again from the sums, the oldest checkpoint's
age given.

Keys (after ``prefix``, default ``"buffer/"``): ``size``, ``capacity``, ``fill``,
``inserts``, ``samples``, ``bytes_in``, ``bytes_out``, ``samples_per_insert``,
``samples_per_insert_target``, ``samples_per_insert_low``, ``samples_per_insert_high``,
``insert_headroom``, ``sample_headroom``, ``blocked_insert_s``, ``blocked_sample_s``,
``waiting_insert``, ``waiting_sample``, ``unique_sampled``, ``unique_sampled_frac``,
``times_sampled_mean``, ``priority_sum``, ``priority_min``, ``priority_max``,
``priority_mean``, ``trajectories``, ``checkpoint_age_s``, ``checkpoint_s``,
``checkpoint_bytes``, ``shards``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

#: added over servers
SUMS = (
    "size", "capacity", "inserts", "samples", "bytes_in", "bytes_out", "insert_headroom",
    "sample_headroom", "blocked_insert_s", "blocked_sample_s", "waiting_insert",
    "waiting_sample", "unique_sampled", "times_sampled_sum", "priority_sum", "priority_items",
    "trajectories", "checkpoint_bytes", "shards", "reserved_bytes", "capacity_bytes",
)  # fmt: skip
#: the least over servers
MINS = ("priority_min", "samples_per_insert_low")
#: the greatest over servers
MAXES = ("priority_max", "samples_per_insert_high", "checkpoint_age_s", "checkpoint_s")


def server_figures(stats: Mapping[str, Any], now: float | None = None) -> dict[str, float]:
    """One server's ``stats`` (from a table's info) as flat figures, without the prefix."""
    rl = stats["rate_limiter"]
    ck = stats["checkpoint"]
    prio = stats.get("priority") or {}
    times = stats.get("times_sampled") or {}
    out: dict[str, Any] = {
        "size": stats["size"],
        "capacity": stats["capacity"],
        "reserved_bytes": stats.get("reserved_bytes"),  # servers before 0.2 do not say
        "capacity_bytes": stats.get("capacity_bytes"),
        "inserts": stats["inserts"],
        "samples": stats["samples"],
        "bytes_in": stats["bytes_in"],
        "bytes_out": stats["bytes_out"],
        "samples_per_insert_target": rl["target"],
        "insert_headroom": rl["headroom"]["insert"],
        "sample_headroom": rl["headroom"]["sample"],
        "blocked_insert_s": rl["blocked_seconds"]["insert"],
        "blocked_sample_s": rl["blocked_seconds"]["sample"],
        "waiting_insert": rl["waiting"]["insert"],
        "waiting_sample": rl["waiting"]["sample"],
        "unique_sampled": stats.get("unique_sampled"),
        "times_sampled_sum": times.get("sum"),
        "priority_sum": prio.get("sum"),
        "priority_items": stats["size"] if prio else None,
        "priority_min": prio.get("min"),
        "priority_max": prio.get("max"),
        "trajectories": stats.get("trajectories"),
        "checkpoint_s": ck["seconds"],
        "checkpoint_bytes": ck["bytes"],
        "checkpoint_age_s": None
        if ck["last_ok_at"] is None
        else max(0.0, (time.time() if now is None else now) - ck["last_ok_at"]),
        "shards": 1,
    }
    band = rl.get("band") or (None, None)
    out["samples_per_insert_low"], out["samples_per_insert_high"] = band
    return {k: float(v) for k, v in out.items() if v is not None}


def merge(figures: list[dict[str, float]]) -> dict[str, float]:
    """Several servers' figures of one table as one (see the module docstring)."""
    out: dict[str, float] = {}
    for keys, pick in ((SUMS, sum), (MINS, min), (MAXES, max)):
        for key in keys:
            values = [f[key] for f in figures if key in f]
            # a sum is only whole when every server has the figure (headroom: no limit on one)
            if values and (pick is not sum or len(values) == len(figures)):
                out[key] = pick(values)
    targets = {f["samples_per_insert_target"] for f in figures if "samples_per_insert_target" in f}
    if len(targets) == 1:
        out["samples_per_insert_target"] = targets.pop()
    return out


def flatten(info: Mapping[str, Any], prefix: str = "buffer/") -> dict[str, float]:
    """``info`` (one server's, or merged with ``shards``) as ``{prefix + key: float}``.

    Raises:
        KeyError: the info has no ``stats`` (a server older than this client).
    """
    shards = info.get("shards") or [info]
    out = merge([server_figures(s["stats"]) for s in shards])
    size = out.get("size", 0.0)
    if out.get("capacity"):
        out["fill"] = size / out["capacity"]
    if out.get("inserts"):
        out["samples_per_insert"] = out["samples"] / out["inserts"]
    if size and "unique_sampled" in out:
        out["unique_sampled_frac"] = out["unique_sampled"] / size
    if size and "times_sampled_sum" in out:
        out["times_sampled_mean"] = out["times_sampled_sum"] / size
    if out.get("priority_items") and "priority_sum" in out:
        out["priority_mean"] = out["priority_sum"] / out["priority_items"]
    for internal in ("times_sampled_sum", "priority_items"):
        out.pop(internal, None)
    return {prefix + key: value for key, value in sorted(out.items())}
