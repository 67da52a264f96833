"""Health probes and metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from ..deps import RegistryDep
from ..registry import Registry

router = APIRouter(tags=["health"])

#: seconds ``/readyz`` waits for the Redis tables' marker probes
PROBE_WAIT = 0.5


@router.get("/healthz", name="healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers. Never needs the token."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    name="readyz",
    responses={
        503: {"description": "Still loading tables, shutting down, or a table's data was lost."}
    },
)
async def readyz(request: Request, registry: RegistryDep) -> JSONResponse:
    """Readiness: the tables of the schemas (and checkpoints) are loaded, and no table's
    backend lost its data (a Redis that restarted empty: answered 503). Never needs the
    token, so it gives counts, not names (``GET /v1/tables`` names them, with the token):
    ``tables`` served, ``lost`` of them, ``failed`` found on start but not served (their
    data kept, the reason in the log)."""
    if not request.app.state.ready:
        return JSONResponse({"status": "starting"}, status_code=503)
    lost = await _lost_tables(registry)
    body = {"tables": len(registry), "lost": len(lost), "failed": len(registry.failed)}
    if lost:
        return JSONResponse({"status": "lost", **body}, status_code=503)
    return JSONResponse({"status": "ready", **body})


async def _lost_tables(registry: Registry) -> list[str]:
    """Tables whose backend lost its data. Redis tables' markers are probed in worker
    threads (each at most once a second, one probe at a time), waited for up to
    ``PROBE_WAIT`` seconds: a hung Redis does not hold the probe."""
    handles = registry.handles()
    probes = [
        asyncio.ensure_future(run_in_threadpool(h.table.backend.probe))
        for h in handles
        if hasattr(h.table.backend, "probe")
    ]
    if probes:
        await asyncio.wait(probes, timeout=PROBE_WAIT)
    return [h.name for h in handles if getattr(h.table.backend, "state", None) == "lost"]


@router.get(
    "/metrics",
    name="metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    text = await run_in_threadpool(request.app.state.metrics.render)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
