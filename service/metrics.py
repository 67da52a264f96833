"""Prometheus metrics: HTTP traffic, table counters, rate-limiter waits.

Served at ``GET /metrics`` in the Prometheus text format. Each app has its
own ``CollectorRegistry`` (several apps may live in one process, as in tests).

HTTP (by route template, method, status):
    ``tdreplay_http_requests_total``, ``tdreplay_http_request_duration_seconds``
    (histogram; for a stream, its whole duration), ``tdreplay_http_received_bytes_total``,
    ``tdreplay_http_sent_bytes_total``.
Tables (read from each table at scrape time):
    ``tdreplay_table_inserts_total``, ``tdreplay_table_samples_total`` (items),
    ``tdreplay_table_bytes_in_total``, ``tdreplay_table_bytes_out_total`` (item bytes),
    ``tdreplay_table_size``, ``tdreplay_table_capacity``, ``tdreplay_table_fill_ratio``,
    ``tdreplay_table_waiting`` (calls waiting for the rate limiter now),
    ``tdreplay_table_lost`` (1: the backend lost the table's data, e.g. a Redis restarted empty).
Rate limiter (by table and ``op``, insert or sample):
    ``tdreplay_rate_limiter_waits_total``, ``tdreplay_rate_limiter_timeouts_total``,
    ``tdreplay_rate_limiter_wait_seconds`` (histogram).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from .core import TableHandle

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})


class TableCollector(Collector):
    """Reads every table's counters at scrape time, without its locks (plain counts; a scrape
    never waits on a table, e.g. behind a checkpoint)."""

    def __init__(self, handles: Callable[[], Iterable[TableHandle]]) -> None:
        self._handles = handles

    def collect(self) -> Iterator[Metric]:
        fams: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "inserts": CounterMetricFamily(
                "tdreplay_table_inserts", "Items inserted.", labels=["table"]
            ),
            "samples": CounterMetricFamily(
                "tdreplay_table_samples", "Items sampled.", labels=["table"]
            ),
            "bytes_in": CounterMetricFamily(
                "tdreplay_table_bytes_in", "Item bytes inserted.", labels=["table"]
            ),
            "bytes_out": CounterMetricFamily(
                "tdreplay_table_bytes_out", "Item bytes sampled.", labels=["table"]
            ),
            "size": GaugeMetricFamily("tdreplay_table_size", "Items stored.", labels=["table"]),
            "capacity": GaugeMetricFamily(
                "tdreplay_table_capacity", "Items the table holds at most.", labels=["table"]
            ),
            "fill": GaugeMetricFamily(
                "tdreplay_table_fill_ratio", "size / capacity.", labels=["table"]
            ),
            "lost": GaugeMetricFamily(
                "tdreplay_table_lost",
                "1 when the table's backend lost its data (a Redis restarted empty), else 0.",
                labels=["table"],
            ),
        }
        waiting = GaugeMetricFamily(
            "tdreplay_table_waiting",
            "Calls waiting for the rate limiter now.",
            labels=["table", "op"],
        )
        for handle in list(self._handles()):
            t = handle.table
            name = [handle.name]
            size, capacity = t.size, t.capacity
            fams["inserts"].add_metric(name, t.rate_limiter.inserts)
            fams["samples"].add_metric(name, t.rate_limiter.samples)
            fams["bytes_in"].add_metric(name, t.bytes_in)
            fams["bytes_out"].add_metric(name, t.bytes_out)
            fams["size"].add_metric(name, size)
            fams["capacity"].add_metric(name, capacity)
            fams["fill"].add_metric(name, size / max(capacity, 1))
            fams["lost"].add_metric(name, float(getattr(t.backend, "state", None) == "lost"))
            for op, count in t.rate_limiter.waiting.items():
                waiting.add_metric([handle.name, op], count)
        yield from fams.values()
        yield waiting


class Metrics:
    """The app's metrics and the hooks that feed them."""

    def __init__(self, handles: Callable[[], Iterable[TableHandle]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        #: labelled children of the request metrics, by (method, route, status)
        self._children: dict[tuple[str, str, int], tuple[Any, Any, Any, Any]] = {}
        self.requests = Counter(
            "tdreplay_http_requests",
            "HTTP requests answered.",
            ["method", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "tdreplay_http_request_duration_seconds",
            "Time from the request's arrival to the response's last byte.",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.received = Counter(
            "tdreplay_http_received_bytes", "Request body bytes received.", ["route"], registry=r
        )
        self.sent = Counter(
            "tdreplay_http_sent_bytes", "Response body bytes sent.", ["route"], registry=r
        )
        self.waits = Counter(
            "tdreplay_rate_limiter_waits",
            "Calls that waited for the rate limiter.",
            ["table", "op"],
            registry=r,
        )
        self.timeouts = Counter(
            "tdreplay_rate_limiter_timeouts",
            "Calls that waited for the rate limiter past their timeout (429).",
            ["table", "op"],
            registry=r,
        )
        self.wait_seconds = Histogram(
            "tdreplay_rate_limiter_wait_seconds",
            "Time calls waited for the rate limiter.",
            ["table", "op"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.periodic = Counter(
            "tdreplay_periodic_checkpoints",
            "Checkpoints written by --checkpoint-every, by outcome.",
            ["table", "outcome"],
            registry=r,
        )
        r.register(TableCollector(handles))

    def checkpointed(self, table: str, outcome: str) -> None:
        """The periodic checkpoints' hook: one checkpoint, ``"ok"`` or ``"failed"``."""
        self.periodic.labels(table, outcome).inc()

    def waited(self, table: str, op: str, seconds: float, timed_out: bool) -> None:
        """The registry's rate-limiter wait hook."""
        self.waits.labels(table, op).inc()
        self.wait_seconds.labels(table, op).observe(seconds)
        if timed_out:
            self.timeouts.labels(table, op).inc()

    def render(self) -> bytes:
        """The text exposition (call from a worker thread)."""
        return generate_latest(self.registry)

    def observe(
        self, method: str, route: str, status: int, seconds: float, received: int, sent: int
    ) -> None:
        method = method if method in METHODS else "other"
        key = (method, route, status)
        children = self._children.get(key)
        if children is None:  # labels() costs more than the update: look each up once
            children = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
                self.received.labels(route),
                self.sent.labels(route),
            )
            self._children[key] = children
        requests, latency, received_bytes, sent_bytes = children
        requests.inc()
        latency.observe(seconds)
        if received:
            received_bytes.inc(received)
        if sent:
            sent_bytes.inc(sent)


class MetricsMiddleware:
    """ASGI middleware timing every HTTP request and counting its body bytes."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        state: dict[str, Any] = {"status": 500, "received": 0, "sent": 0}

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
            return message

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body":
                state["sent"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            route = scope.get("route")
            self.metrics.observe(
                scope["method"],
                getattr(route, "path", "unmatched"),
                state["status"],
                time.perf_counter() - start,
                state["received"],
                state["sent"],
            )
