"""deploy/grafana/tdreplay.json: every panel's metrics exist in /metrics of a live server with traffic."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
import torch
from obs_helpers import scrape, spec
from testkit import REPO, rows

from tdreplay.client import ReplayClient

DASHBOARD = REPO / "deploy" / "grafana" / "tdreplay.json"
METRIC = re.compile(r"\btdreplay_[a-z0-9_]+")
BY = re.compile(r"\bby \(([^)]*)\)")
ADDED_BY_PROMETHEUS = {"instance", "job"}


@pytest.fixture(scope="module")
def traffic(live_server: Any) -> Any:
    """A server whose every metric family has samples: a prioritized table with a rate
    limiter, a slice table, a checkpoint, HTTP and shared-memory requests."""
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    limiter = {"samples_per_insert": 1.0, "error_buffer": 64.0, "min_size_to_sample": 1}
    client.create_table(spec("g", {"kind": "prioritized"}, rate_limiter=limiter))
    client.create_table(spec("gs", {"kind": "slice", "slice_len": 2, "end_key": "next.done"}))
    client.extend("g", rows(0, 16))
    client.extend("gs", rows(0, 16))
    batch = client.sample("g", 8)
    client.update_priority("g", batch["index"], torch.rand(8))
    client.sample("gs", 4)
    client.checkpoint("g", "checkpoints/g")
    if hasattr(os, "memfd_create"):
        ReplayClient(server.url, transport="shm").sample("g", 4)
    return server


def panels() -> list[dict[str, Any]]:
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        out += panel.get("panels", [panel])  # rows hold panels
    return out


def test_the_dashboard_is_whole() -> None:
    dash = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance", "table"} <= variables
    assert len(panels()) >= 8
    for panel in panels():
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert "$instance" in target["expr"] and "$table" in target["expr"], panel["title"]
    titles = " ".join(p["title"] for p in panels()).lower()
    for plot in (
        "fill",
        "insert and sample rate",
        "samples per insert",
        "blocked",
        "latency",
        "priority",
    ):
        assert plot in titles


def test_every_panel_metric_exists(traffic: Any) -> None:
    samples = scrape(traffic)
    names = {name for name, _ in samples}
    labelled: dict[str, set[str]] = {}
    for name, labels in samples:
        labelled.setdefault(name, set()).update(k for k, _ in labels)
    checked = 0
    for panel in panels():
        for target in panel["targets"]:
            expr = target["expr"]
            metrics = set(METRIC.findall(expr))
            assert metrics, (panel["title"], expr)
            for metric in metrics:
                assert metric in names, f"panel {panel['title']!r}: {metric} is not in /metrics"
                for group in BY.findall(expr):
                    wanted = {g.strip() for g in group.split(",")} - ADDED_BY_PROMETHEUS
                    assert wanted <= labelled[metric], (panel["title"], metric, wanted)
                checked += 1
    assert checked >= 20
