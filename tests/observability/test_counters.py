"""Table figures mean what their names say: in ``info``, in ``/metrics``, over HTTP and shm.

One real server; traffic from the client over both transports; every count
checked against what the test itself did.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any

import pytest
import torch
from obs_helpers import labels, scrape, spec
from testkit import rows

from tdreplay.client import ReplayClient

K, N = 2, 3  # N extends of K rows


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    return live_server()


def test_counts_unique_sampled_priorities_and_blocked_time(server: Any) -> None:
    client = ReplayClient(server.url, transport="http")
    # samples_per_insert 1, error_buffer 8: min_diff -7, max_diff 9
    limiter = {"samples_per_insert": 1.0, "error_buffer": 8.0, "min_size_to_sample": 1}
    client.create_table(spec("p", {"kind": "prioritized"}, rate_limiter=limiter))
    for i in range(N):
        client.extend("p", rows(i * K, K))
    drawn: Counter[int] = Counter()
    for _ in range(2):
        batch = client.sample("p", 3)
        drawn.update(batch["index"].tolist())
    stats = client.info("p")["stats"]
    assert (stats["inserts"], stats["samples"], stats["size"]) == (N * K, 6, N * K)
    assert stats["unique_sampled"] == len(drawn)
    hist = stats["times_sampled"]
    expected = [0] * len(hist["edges"])
    expected[0] = N * K - len(drawn)
    for times in drawn.values():
        expected[max(i for i, e in enumerate(hist["edges"]) if e <= times)] += 1
    assert hist["counts"] == expected and hist["sum"] == 6
    # priorities: every item set to a known value
    index = torch.arange(N * K)
    prio = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0, 8.0])
    client.update_priority("p", index, prio)
    p = client.info("p")["stats"]["priority"]
    assert p["sum"] == pytest.approx(18.5) and (p["min"], p["max"]) == (0.5, 8.0)
    assert sum(p["counts"]) == N * K
    assert p["counts"][p["edges"].index(2.0)] == 2 and p["counts"][p["edges"].index(8.0)] == 1

    # the limiter: diff = 6 - 6 = 0; 9 more rows fill it to max_diff; one more waits
    client.extend("p", rows(100, 9))
    rl = client.info("p")["stats"]["rate_limiter"]
    assert rl["headroom"]["insert"] == 0 and rl["samples_per_insert"] == pytest.approx(6 / 15)
    assert rl["band"] == pytest.approx([1 - 9 / 15, 1 + 7 / 15])
    blocked = threading.Thread(target=lambda: client.extend("p", rows(200, 1), timeout=10))
    blocked.start()
    time.sleep(0.5)
    held = client.info("p")["stats"]["rate_limiter"]
    assert held["waiting"]["insert"] == 1 and held["blocked_seconds"]["insert"] >= 0.45
    client.sample("p", 5)  # diff 9 -> 4: the insert goes through
    blocked.join(10)
    rl = client.info("p")["stats"]["rate_limiter"]
    assert rl["waits"]["insert"] == 1 and rl["waiting"]["insert"] == 0
    assert 0.45 <= rl["blocked_seconds"]["insert"] < 10
    assert rl["blocked_seconds"]["sample"] == 0

    path = client.checkpoint("p", "checkpoints/p")
    assert path
    m = scrape(server)
    t = labels(table="p")
    assert m[("tdreplay_table_inserts_total", t)] == N * K + 10
    assert m[("tdreplay_table_samples_total", t)] == 11
    assert (
        m[("tdreplay_rate_limiter_blocked_seconds_total", labels(table="p", op="insert"))] >= 0.45
    )
    assert m[("tdreplay_table_priority_max", t)] >= 8.0
    assert m[("tdreplay_table_times_sampled_items_bucket", labels(table="p", le="+Inf"))] == 16
    assert m[("tdreplay_table_checkpoints_total", labels(table="p", outcome="ok"))] == 1
    assert m[("tdreplay_table_checkpoint_bytes", t)] > 0
    assert time.time() - m[("tdreplay_table_checkpoint_last_success_timestamp_seconds", t)] < 60
    ok = {"transport": "http", "table": "p", "outcome": "ok"}
    assert m[("tdreplay_requests_total", labels(op="extend", **ok))] == N + 2
    assert m[("tdreplay_requests_total", labels(op="sample", **ok))] == 3
    hist_count = (
        "tdreplay_request_duration_seconds_count",
        labels(transport="http", op="sample", table="p"),
    )
    assert m[hist_count] == 3


def test_trajectories_of_a_slice_table(server: Any) -> None:
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("s", {"kind": "slice", "slice_len": 2, "end_key": "next.done"}))
    client.extend("s", rows(0, 25))  # episodes end at ids 9 and 19: 3 episodes
    assert client.info("s")["stats"]["trajectories"] == 3
    assert scrape(server)[("tdreplay_table_trajectories", labels(table="s"))] == 3


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create")
def test_shm_requests_are_counted_under_transport_shm(server: Any) -> None:
    http = ReplayClient(server.url, transport="http")
    http.create_table(spec("m"))
    item = http.info("m")["item_nbytes"]
    shm = ReplayClient(server.url, transport="shm")
    for i in range(2):
        shm.extend("m", rows(i * 4, 4))
    for _ in range(3):
        shm.sample("m", 5)
    m = scrape(server)
    ok = {"transport": "shm", "table": "m", "outcome": "ok"}
    assert m[("tdreplay_requests_total", labels(op="extend", **ok))] == 2
    assert m[("tdreplay_requests_total", labels(op="sample", **ok))] == 3
    shm_labels = {"transport": "shm", "table": "m"}
    assert (
        m[("tdreplay_request_received_bytes_total", labels(op="extend", **shm_labels))] >= 8 * item
    )
    assert m[("tdreplay_request_sent_bytes_total", labels(op="sample", **shm_labels))] >= 15 * item
    assert (
        "tdreplay_requests_total",
        labels(op="sample", transport="http", table="m", outcome="ok"),
    ) not in m
    assert m[("tdreplay_table_inserts_total", labels(table="m"))] == 8
    # a name no table has makes no label of its own
    server.request("POST", "/v1/tables/nope-xyz/sample?batch_size=1")
    assert not any(dict(k[1]).get("table") == "nope-xyz" for k in scrape(server))
