"""The app factory: ``create_app(settings)`` builds the FastAPI app, its lifespan loads the tables.

    >>> from tdreplay.service import Settings, create_app
    >>> app = create_app(Settings(schema_path="schemas/", root="/tmp/tdreplay-data"))
    >>> # uvicorn.run(app, host=..., port=...), or `tdreplay serve`

On start the lifespan applies the process tuning (malloc thresholds, torch
threads), locks the data root for the process (a second server on it fails
with :class:`~tdreplay.storage.RootLocked`, see
:func:`tdreplay.storage.lock_root`), cleans up what interrupted checkpoints left
in ``<root>/checkpoints/`` (:func:`~tdreplay.storage.clean_checkpoints`),
then creates a table for every schema under ``schema_path`` and, with
``restore``, restores every checkpoint under ``<root>/checkpoints/`` (a
checkpoint wins over the schema of the same table). ``/readyz`` answers 200
once that is done. With ``checkpoint_every``, a background task then
checkpoints the memory, shared and h5 tables periodically. On shutdown it
stops that task, checkpoints the tables when asked, closes them and releases
the root.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from tdreplay.codec import protocol
from tdreplay.codec.ipc import LayoutDecoder
from tdreplay.storage import TDReplayError, clean_checkpoints, lock_root
from tdreplay.system import shm_supported

from . import errors, shm, tuning
from .bodies import BodyBuffers
from .core import Core, PeriodicCheckpoints, load_tables
from .core.paths import SCRATCH
from .hosts import HostNames, is_loopback
from .hotpath import HotRoutes
from .metrics import Metrics, MetricsMiddleware, RequestHook
from .routes import data, health, persistence, server, tables
from .routes.data import HOT_ROUTES
from .security import BearerAuth, BrowserGuard
from .settings import Settings
from .status import routes as status
from .status.history import History

log = logging.getLogger("tdreplay.service")

VERSION = "0.1.0"


async def start_shm(
    core: Core, settings: Settings, on_request: RequestHook | None = None
) -> shm.ShmServer | None:
    """The same-host transport, listening; ``None`` when it is off or cannot run here.

    Raises:
        InvalidRequest: ``--shm-socket`` was given and cannot be listened on.
    """
    if not settings.shm:
        return None
    if not shm_supported():
        log.warning("no same-host transport: this OS lacks memfd_create or SCM_RIGHTS")
        return None
    path = settings.shm_socket or core.root / "run" / "tdreplay.sock"
    server = shm.ShmServer(core, settings, Path(path).absolute(), on_request)
    try:
        await server.start()
    except TDReplayError as err:
        if settings.shm_socket is not None:
            raise
        log.warning("no same-host transport: %s", err)  # e.g. a root too deep for a socket path
        return None
    return server


def create_app(settings: Settings | None = None) -> FastAPI:
    """The tdreplay FastAPI app for ``settings`` (default: from the environment)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Re-entrant: a second client entering the lifespan of a running app (as test
        # clients do) finds the tables loaded; the outermost exit closes them.
        state = app.state
        state.lifespans += 1
        try:
            if state.lifespans == 1:
                await _start(app)
            yield
        finally:
            state.lifespans -= 1
            if state.lifespans == 0:
                state.ready = False
                await _stop(app)

    async def _start(app: FastAPI) -> None:
        tuning.apply(settings)
        core: Core = app.state.core
        # First, before anything under the root is touched: a second server here
        # would delete the first one's tables.
        app.state.root_lock = lock_root(core.root)
        try:
            clean_checkpoints(core.root / protocol.CHECKPOINTS)
            for scratch in SCRATCH:  # what a crash left of exports and dumps on their way
                shutil.rmtree(core.root / scratch, ignore_errors=True)
            await load_tables(core, settings)
            tuning.trim()  # what loading the tables freed goes back to the system
            app.state.shm = await start_shm(core, settings, app.state.metrics.request)
        except BaseException:
            await core.close()
            app.state.root_lock.close()
            app.state.root_lock = None
            raise
        if settings.checkpoint_every:
            periodic = PeriodicCheckpoints(
                core, settings.checkpoint_every, app.state.metrics.checkpointed
            )
            periodic.start()
            app.state.periodic = periodic
            log.info(
                "checkpointing the tables every %g s%s",
                settings.checkpoint_every,
                "" if settings.checkpoint_durable else " (memmap tables need none: skipped)",
            )
        app.state.history.start()
        app.state.ready = True

    async def _stop(app: FastAPI) -> None:
        state = app.state
        try:
            await state.history.stop()
            if state.periodic is not None:
                await state.periodic.stop()
                state.periodic = None
            if state.shm is not None:
                await state.shm.stop()
                state.shm = None
            await state.core.close(checkpoint=settings.checkpoint_on_shutdown)
        finally:
            if state.root_lock is not None:
                state.root_lock.close()
                state.root_lock = None

    app = FastAPI(
        title="tdreplay",
        version=VERSION,
        summary="A storage-first replay-buffer service for PyTorch RL.",
        description=(
            "Tables declared by schemas; rows travel as Arrow IPC streams "
            f"(`{protocol.ARROW_STREAM}`), control and errors as JSON "
            "(`{type, detail, field}`). See `tdreplay.codec.protocol`."
        ),
        lifespan=lifespan,
        docs_url=None,  # served by _offline_docs from bundled assets, not a CDN
    )
    _offline_docs(app)
    metrics = Metrics(
        lambda: app.state.core.served.handles(),
        lambda: app.state.shm,
        lambda name: name in app.state.core.served,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.history = History(metrics, lambda: app.state.core.served.handles())
    app.state.core = Core(settings, events=metrics)
    app.state.bodies = BodyBuffers(
        per_class=settings.pooled_buffers, budget=app.state.core.served.buffers
    )
    app.state.decoder = LayoutDecoder()
    app.state.ready = False
    app.state.lifespans = 0
    app.state.periodic = None
    app.state.shm = None
    app.state.version = VERSION
    app.state.root_lock = None
    errors.install(app, app.state.core.root)
    for module in (
        data,
        tables,
        persistence,
        server,
        health,
        status,
    ):  # hot routes first: matched in order
        app.include_router(module.router)
    # innermost: authentication and metrics (added below) see the hot routes' requests too
    app.add_middleware(HotRoutes, fastapi=app, router=data.router, handlers=HOT_ROUTES)
    if settings.token_bytes:
        app.add_middleware(BearerAuth, token=settings.token_bytes)
        _declare_bearer(app)
    else:  # no token: whoever reaches the port is trusted, but not a web page on another site
        app.add_middleware(BrowserGuard, hosts=HostNames(settings.allow_host))
    if not settings.token_bytes and not is_loopback(
        settings.host
    ):  # only with --insecure: Settings refuses it otherwise
        log.warning(
            "serving %s with no token (--insecure): whoever reaches the port may read, write "
            "and delete every table",
            settings.host,
        )
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: counts 401s too
    return app


#: the Swagger UI files /docs needs, served from the swagger-ui-bundle package (works offline)
DOCS_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
}


def _offline_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI from the assets bundled with ``swagger-ui-bundle``, no CDN."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import FileResponse, HTMLResponse
    from starlette.exceptions import HTTPException
    from swagger_ui_bundle import swagger_ui_path

    assets = Path(swagger_ui_path)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - API",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon-32x32.png",
        )
        # framed by another site, its "Try it out" would send same-origin requests
        page.headers.update(
            {"Content-Security-Policy": "frame-ancestors 'none'", **status.PAGE_HEADERS}
        )
        return page

    @app.get("/docs/assets/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> FileResponse:
        if name not in DOCS_ASSETS:  # a fixed list: no path from the request reaches the disk
            raise HTTPException(404, f"no docs asset {name!r}")
        return FileResponse(assets / name, media_type=DOCS_ASSETS[name])


def _declare_bearer(app: FastAPI) -> None:
    """Add the bearer scheme to the OpenAPI document (the docs' Authorize button)."""
    base = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = base()
        schema.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"}
        }
        public = {"/healthz", "/readyz"}
        for path, ops in schema.get("paths", {}).items():
            for op in ops.values():
                if path not in public:
                    op["security"] = [{"bearer": []}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
