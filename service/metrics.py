"""Prometheus metrics: requests by transport, HTTP traffic, table figures, rate-limiter waits.

Served at ``GET /metrics`` in the Prometheus text format. Each app has its
own ``CollectorRegistry`` (several apps may live in one process, as in tests).

Requests, whatever door they came through (by ``transport`` = http / shm,
``op`` = the operation: the HTTP route's name or the socket's op, and
``table``: the served table the request named, else ``-``):
    ``tdreplay_requests_total`` (with ``outcome`` = ok / error),
    ``tdreplay_request_duration_seconds`` (histogram), ``tdreplay_request_received_bytes_total``,
    ``tdreplay_request_sent_bytes_total`` (HTTP: body bytes; shm: control frames plus the
    item bytes moved through the shared-memory slot).
HTTP (by route template, method, status):
    ``tdreplay_http_requests_total``, ``tdreplay_http_request_duration_seconds``
    (histogram; for a stream, its whole duration), ``tdreplay_http_received_bytes_total``,
    ``tdreplay_http_sent_bytes_total``.
Tables and their rate limiters: read at scrape time, see :mod:`.status.collector`.
Rate-limiter waits (by table and ``op``, insert or sample), counted as each ends:
    ``tdreplay_rate_limiter_waits_total``, ``tdreplay_rate_limiter_timeouts_total``,
    ``tdreplay_rate_limiter_wait_seconds`` (histogram).
Polling of same-host connections (``--shm-poll-us``), read at scrape time:
    ``tdreplay_shm_polls_total`` (with ``outcome`` = found / missed: a request came within
    the window, or not) and ``tdreplay_shm_poll_seconds_total`` (the CPU time it took).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .status.collector import TableCollector

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
#: the table label of a request that names no served table (unbounded names make no labels)
NO_TABLE = "-"
#: what a request is reported to: transport, op, table, seconds, bytes received, sent, ok
RequestHook = Callable[[str, str, str, float, int, int, bool], None]


class Polls(Protocol):
    """What the same-host listener counts of its polling."""

    polls_found: int
    polls_missed: int
    poll_seconds: float


class PollCollector(Collector):
    """The same-host listener's polling (``None``: no listener), at each scrape."""

    def __init__(self, polls: Callable[[], Polls | None]) -> None:
        self._polls = polls

    def collect(self) -> Iterator[CounterMetricFamily]:
        p = self._polls()
        polls = CounterMetricFamily(
            "tdreplay_shm_polls",
            "Polls of a same-host connection for its next request after an answer "
            "(--shm-poll-us), by outcome: found (a request came within the window) or missed.",
            labels=["outcome"],
        )
        polls.add_metric(["found"], p.polls_found if p else 0)
        polls.add_metric(["missed"], p.polls_missed if p else 0)
        yield polls
        yield CounterMetricFamily(
            "tdreplay_shm_poll_seconds",
            "Seconds spent polling same-host connections for their next request.",
            value=p.poll_seconds if p else 0.0,
        )


class Metrics:
    """The app's metrics and the hooks that feed them."""

    def __init__(
        self,
        handles: Callable[[], Iterable[TableHandle]],
        polls: Callable[[], Polls | None] = lambda: None,
        served: Callable[[str], bool] = lambda name: True,
    ) -> None:
        #: whether a table is served: only a served table's name makes labels
        self.served = served
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        #: labelled children of the request metrics, by (method, route, status)
        self._children: dict[tuple[str, str, int], tuple[Any, Any, Any, Any]] = {}
        #: and of the per-transport ones, by (transport, op, table, ok)
        self._by_op: dict[tuple[str, str, str, bool], tuple[Any, Any, Any, Any]] = {}
        self.op_requests = Counter(
            "tdreplay_requests",
            "Requests answered, by transport, operation, table and outcome.",
            ["transport", "op", "table", "outcome"],
            registry=r,
        )
        self.op_latency = Histogram(
            "tdreplay_request_duration_seconds",
            "Time from a request's arrival to its answer's last byte, by transport, op, table.",
            ["transport", "op", "table"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.op_received = Counter(
            "tdreplay_request_received_bytes",
            "Bytes received with requests (shm: frames and slot data).",
            ["transport", "op", "table"],
            registry=r,
        )
        self.op_sent = Counter(
            "tdreplay_request_sent_bytes",
            "Bytes sent with answers (shm: frames and slot data).",
            ["transport", "op", "table"],
            registry=r,
        )
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
        r.register(PollCollector(polls))

    def checkpointed(self, table: str, outcome: str) -> None:
        """The periodic checkpoints' hook: one checkpoint, ``"ok"`` or ``"failed"``."""
        self.periodic.labels(table, outcome).inc()

    def waited(self, table: str, op: str, seconds: float, timed_out: bool) -> None:
        """The registry's rate-limiter wait hook."""
        if not self.served(table):
            return
        self.waits.labels(table, op).inc()
        self.wait_seconds.labels(table, op).observe(seconds)
        if timed_out:
            self.timeouts.labels(table, op).inc()

    def request(
        self,
        transport: str,
        op: str,
        table: str,
        seconds: float,
        received: int,
        sent: int,
        ok: bool,
    ) -> None:
        """One request through ``transport`` (a :data:`RequestHook`); ``table``: the table
        it named (counted as :data:`NO_TABLE` unless served), ``op`` one of a fixed set."""
        if table != NO_TABLE and not self.served(table):
            table = NO_TABLE
        key = (transport, op, table, ok)
        children = self._by_op.get(key)
        if children is None:
            children = (
                self.op_requests.labels(transport, op, table, "ok" if ok else "error"),
                self.op_latency.labels(transport, op, table),
                self.op_received.labels(transport, op, table),
                self.op_sent.labels(transport, op, table),
            )
            self._by_op[key] = children
        requests, latency, received_bytes, sent_bytes = children
        requests.inc()
        latency.observe(seconds)
        if received:
            received_bytes.inc(received)
        if sent:
            sent_bytes.inc(sent)

    def forget(self, table: str) -> None:
        """Drop every series of ``table`` (no longer served: its name makes no more labels)."""
        for wait in ("insert", "sample"):
            for metric in (self.waits, self.timeouts, self.wait_seconds):
                with contextlib.suppress(KeyError):
                    metric.remove(table, wait)
        for outcome in ("ok", "failed"):
            with contextlib.suppress(KeyError):
                self.periodic.remove(table, outcome)
        for key in [k for k in self._by_op if k[2] == table]:
            transport, op, _, ok = key
            del self._by_op[key]
            for metric, labels in (
                (self.op_requests, (transport, op, table, "ok" if ok else "error")),
                (self.op_latency, (transport, op, table)),
                (self.op_received, (transport, op, table)),
                (self.op_sent, (transport, op, table)),
            ):
                with contextlib.suppress(KeyError):
                    metric.remove(*labels)

    def latency_buckets(self) -> dict[tuple[str, str], list[float]]:
        """Cumulative counts of :attr:`op_latency`'s buckets by (table, op), summed over the
        transports (for :mod:`.status.history`)."""
        out: dict[tuple[str, str], list[float]] = {}
        for family in self.op_latency.collect():
            for sample in family.samples:
                if not sample.name.endswith("_bucket"):
                    continue
                labels = sample.labels
                counts = out.setdefault(
                    (labels["table"], labels["op"]), [0.0] * (len(LATENCY_BUCKETS) + 1)
                )
                le = labels["le"]
                i = len(LATENCY_BUCKETS) if le == "+Inf" else LATENCY_BUCKETS.index(float(le))
                counts[i] += sample.value
        return out

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
            seconds = time.perf_counter() - start
            route = scope.get("route")
            status, received, sent = state["status"], state["received"], state["sent"]
            self.metrics.observe(
                scope["method"],
                getattr(route, "path", "unmatched"),
                status,
                seconds,
                received,
                sent,
            )
            table = scope.get("path_params", {}).get("name", NO_TABLE)
            op = getattr(route, "name", "unmatched")
            self.metrics.request("http", op, table, seconds, received, sent, status < 400)
