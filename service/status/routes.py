"""The ``/status`` page and the JSON it polls.

How the page authenticates. A browser cannot put a bearer token on a page it
navigates to, so the page is split in two:

* ``GET /status`` and its assets (``/status/assets/<file>``, a fixed list of
  files bundled with the package: uPlot, the page's script and style) are
  public. They hold no data and no table name: only the shell, rendered by
  the server with its version and whether a token is needed.
* ``GET /v1/status`` holds every figure and is guarded like every other
  route. The page's script asks for the token once (a password field; it is
  kept in the tab's ``sessionStorage``, gone when the tab closes) and sends
  it as ``Authorization: Bearer`` on each poll. The token never appears in a
  URL, so no access log, proxy log or browser history holds it.

The page's Content-Security-Policy allows scripts, styles and requests to
this origin only (``'self'``): nothing on it can reach another host, and
table names go into the page as text (``textContent``), never as markup.
"""

from __future__ import annotations

import contextlib
import time
from functools import cache, partial
from html import escape
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException

from tdreplay.codec.operations import STATUS
from tdreplay.storage import TableClosed, TableNotFound

from ..deps import CoreDep, declare, error_responses

#: the bundled files the page loads, and their media types
ASSETS = {
    "uplot.iife.min.js": "text/javascript",
    "uplot.min.css": "text/css",
    "status.js": "text/javascript",
    "status.css": "text/css",
}
#: the paths a browser loads without a token (the shell: no data)
PUBLIC_PATHS = frozenset({"/status", *(f"/status/assets/{name}" for name in ASSETS)})
#: seconds a table's lock is waited for by ``/v1/status`` before the last scan is used
STATS_WAIT = 0.05
#: headers of every page the server renders (this one, ``/docs``): no other site may frame
#: it (an overlaid page would click its buttons: the docs' "Try it out" clears a table)
PAGE_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    **PAGE_HEADERS,
}

router = APIRouter(tags=["status"])


@cache
def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("assets", name).read_bytes()


@router.get("/status", name="status_page", include_in_schema=False)
async def status_page(request: Request) -> HTMLResponse:
    """The status page's shell (public: no data; see the module docstring)."""
    state = request.app.state
    page = _asset("page.html").decode()
    for key, value in {
        "version": state.version,
        "interval": f"{state.history.interval:g}",
        "auth": "bearer" if state.settings.token_bytes else "none",
    }.items():
        page = page.replace("{{" + key + "}}", escape(str(value), quote=True))
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-store"}
    return HTMLResponse(page, headers=headers)


@router.get("/status/assets/{asset}", name="status_asset", include_in_schema=False)
async def status_asset(asset: str) -> Response:
    """A bundled file of the page (a fixed list: no path from the request reaches the disk)."""
    media = ASSETS.get(asset)
    if media is None:
        raise HTTPException(404, f"no status asset {asset!r}")
    return Response(_asset(asset), media_type=media, headers=SECURITY_HEADERS)


@declare(router, STATUS, responses=error_responses())
async def status(request: Request, core: CoreDep) -> dict[str, Any]:
    """What the ``/status`` page plots: per table, ``stats`` (as in its info) and ``series``,
    its recent history (columns: ``t``, ``fill``, ``size``, ``insert_rate``,
    ``sample_rate``, ``spi``, ``spi_low``, ``spi_high``, ``blocked_insert``,
    ``blocked_sample``, ``sample_p50``, ``sample_p99``, ``extend_p50``, ``extend_p99``;
    rates per second, latencies in seconds, ``null`` where nothing was measured)."""
    history = request.app.state.history
    tables = []
    for handle in core.served.handles():
        with contextlib.suppress(TableNotFound, TableClosed), handle.use() as table:
            stats = await handle.call(partial(table.stats, wait=STATS_WAIT))
            tables.append(
                {
                    "name": handle.name,
                    "backend": table.spec.backend.kind,
                    "sampler": table.sampler.kind,
                    "stats": stats,
                    "series": history.series(handle.name),
                }
            )
    return {
        "time": time.time(),
        "interval": history.interval,
        "version": request.app.state.version,
        "tables": tables,
    }
