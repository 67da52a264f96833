"""Health probes and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from ..deps import RegistryDep

router = APIRouter(tags=["health"])


@router.get("/healthz", name="healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers. Never needs the token."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    name="readyz",
    responses={503: {"description": "Still loading tables, or shutting down."}},
)
async def readyz(request: Request, registry: RegistryDep) -> JSONResponse:
    """Readiness: the tables of the schemas (and checkpoints) are loaded. Never needs the token."""
    if not request.app.state.ready:
        return JSONResponse({"status": "starting"}, status_code=503)
    return JSONResponse({"status": "ready", "tables": registry.names()})


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
