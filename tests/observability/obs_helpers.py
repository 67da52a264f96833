"""Observability test fixtures: a table spec, traffic, and /metrics parsed."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from testkit import FIELDS


def spec(name: str, sampler: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": 64,
        "fields": dict(FIELDS),
        "backend": {"kind": "memory"},
        "sampler": sampler or {"kind": "uniform"},
        **extra,
    }


def scrape(server: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` of a live server: ``{(sample name, sorted labels): value}``."""
    status, _, body = server.request("GET", "/metrics")
    assert status == 200, body
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def labels(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kw.items()))
