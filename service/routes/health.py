"""Health probes and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from tdreplay.codec.operations import HEALTHZ

from ..deps import CoreDep, declare

router = APIRouter(tags=["health"])


@declare(router, HEALTHZ)
async def healthz() -> dict[str, str]:
    """Liveness: the process answers. Never needs the token."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    name="readyz",
    responses={
        503: {
            "description": "Still loading tables, shutting down, or a table cannot serve: its "
            "data was lost, or its Redis is unreachable."
        }
    },
)
async def readyz(request: Request, core: CoreDep) -> JSONResponse:
    """Readiness: the tables of the schemas (and checkpoints) are loaded, and every table
    served can serve: no backend lost its data (a Redis that restarted empty, or from an older snapshot: ``lost``) or
    cannot be reached (a Redis down, hung or refusing: ``unreachable``, ready again once it
    answers). Either answers 503, so a load balancer sends the table's clients elsewhere;
    liveness (``/healthz``) stays 200, so the server is not restarted for its Redis. Never
    needs the token, so it gives counts, not names (``GET /v1/tables`` names them, with the
    token): ``tables`` served, ``lost`` and ``unreachable`` of them, ``failed`` found on
    start but not served (their data kept, the reason in the log)."""
    if not request.app.state.ready:
        return JSONResponse({"status": "starting"}, status_code=503)
    unready = await core.unready_tables()
    served = core.served
    body = {
        "tables": len(served),
        **{state: len(names) for state, names in unready.items()},
        "failed": len(served.failed),
    }
    for state in ("lost", "unreachable"):
        if unready[state]:
            return JSONResponse({"status": state, **body}, status_code=503)
    return JSONResponse({"status": "ready", **body})


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
