"""GET /v1/status and the history behind it; the page's shell and assets (in-process apps)."""

from __future__ import annotations

from typing import Any

import pytest
from obs_helpers import spec
from testkit import rows

from tdreplay.codec import encode, protocol
from tdreplay.service.metrics import LATENCY_BUCKETS
from tdreplay.service.status.history import COLUMNS, History, quantile

ARROW = {"Content-Type": protocol.ARROW_STREAM}


def fill(client: Any, name: str, n: int) -> None:
    assert client.post(protocol.TABLES, json=spec(name)).status_code == 201
    r = client.post(
        protocol.table_path(name, "extend"), content=encode(rows(0, n)).to_pybytes(), headers=ARROW
    )
    assert r.status_code == 200, r.text


def test_status_json_and_a_bounded_history(service: Any) -> None:
    client = service()
    fill(client, "a", 12)
    fill(client, "b", 3)
    history = client.app.state.history
    small = History(client.app.state.metrics, history.handles, points=3)
    for _ in range(5):
        small.tick()
    assert {len(ring) for ring in small.rings.values()} == {3}  # 4 readings with rates, 3 kept
    body = client.get("/v1/status").json()
    assert [t["name"] for t in body["tables"]] == ["a", "b"]
    a = body["tables"][0]
    assert a["stats"]["size"] == 12 and a["stats"]["inserts"] == 12
    assert set(a["series"]) == set(COLUMNS)
    assert len({len(v) for v in a["series"].values()}) == 1
    assert client.delete(f"{protocol.TABLES}/b").status_code == 204
    small.tick()
    assert set(small.rings) == {"a"}


def test_quantile_interpolates_in_its_bucket() -> None:
    counts = [0.0] * (len(LATENCY_BUCKETS) + 1)
    i = LATENCY_BUCKETS.index(0.01)  # 100 requests in (0.005, 0.01]
    for j in range(i, len(counts)):
        counts[j] = 100.0
    assert quantile(0.5, counts) == pytest.approx(0.0075)
    assert quantile(0.5, [0.0] * len(counts)) is None


def test_shell_and_assets_without_token_json_with_it(service: Any) -> None:
    client = service(token="sekrit-t0ken")
    page = client.get("/status")
    assert page.status_code == 200 and 'data-auth="bearer"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for asset in ("status.js", "status.css", "uplot.iife.min.js", "uplot.min.css"):
        assert client.get(f"/status/assets/{asset}").status_code == 200
    assert client.get("/status/assets/other.js").status_code == 401  # not public: no probing
    assert client.get("/v1/status").status_code == 401
    auth = {"Authorization": "Bearer sekrit-t0ken"}
    assert client.get("/status/assets/other.js", headers=auth).status_code == 404
    assert client.get("/v1/status", headers=auth).json()["tables"] == []
