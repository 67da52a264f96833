"""/metrics: Prometheus text with table counters, HTTP traffic and latency, rate-limiter waits."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from service_helpers import body, create, extend

from tdreplay.codec import protocol


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics(service) -> None:
    client = service()
    create(client, capacity=20)
    extend(client, 0, 8)
    client.post(protocol.table_path("t", "sample"), params={"batch_size": 3})
    client.post(protocol.table_path("t", "sample"), params={"batch_size": 3, "timeout": 0})
    client.post(protocol.table_path("nope", "sample"), params={"batch_size": 3})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = _samples(r.text)
    t = (("table", "t"),)
    assert m[("tdreplay_table_inserts_total", t)] == 8
    assert m[("tdreplay_table_samples_total", t)] == 6
    assert m[("tdreplay_table_size", t)] == 8
    assert m[("tdreplay_table_capacity", t)] == 20
    assert m[("tdreplay_table_fill_ratio", t)] == 0.4
    assert m[("tdreplay_table_bytes_in_total", t)] > 0
    assert m[("tdreplay_table_bytes_out_total", t)] > 0
    assert m[("tdreplay_table_waiting", (("op", "sample"), ("table", "t")))] == 0
    sample_route = "/v1/tables/{name}/sample"
    ok = (("method", "POST"), ("route", sample_route), ("status", "200"))
    assert m[("tdreplay_http_requests_total", ok)] == 2
    missing = (("method", "POST"), ("route", sample_route), ("status", "404"))
    assert m[("tdreplay_http_requests_total", missing)] == 1
    latency = (("method", "POST"), ("route", sample_route))
    assert m[("tdreplay_http_request_duration_seconds_count", latency)] == 3
    assert m[
        ("tdreplay_http_received_bytes_total", (("route", "/v1/tables/{name}/extend"),))
    ] == len(body(0, 8))
    assert m[("tdreplay_http_sent_bytes_total", (("route", sample_route),))] > 0
    unmatched = client.get("/nothing/here")
    assert unmatched.status_code == 404
    m = _samples(client.get("/metrics").text)
    assert (
        m[
            (
                "tdreplay_http_requests_total",
                (("method", "GET"), ("route", "unmatched"), ("status", "404")),
            )
        ]
        == 1
    )
