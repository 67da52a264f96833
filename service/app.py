"""The app factory: ``create_app(settings)`` builds the FastAPI app, its lifespan loads the tables.

    >>> from tdreplay.service import Settings, create_app
    >>> app = create_app(Settings(schema_path="schemas/", root="/tmp/tdreplay-data"))
    >>> # uvicorn.run(app, host=..., port=...), or `tdreplay serve`

On start the lifespan applies the process tuning (malloc thresholds, torch
threads), then creates a table for every schema under ``schema_path`` and,
with ``restore``, restores every checkpoint under ``<root>/checkpoints/``
(a checkpoint wins over the schema of the same table). ``/readyz`` answers
200 once that is done. On shutdown it checkpoints the tables when asked and
closes them.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlparse

from fastapi import FastAPI

from tdreplay.codec import protocol
from tdreplay.storage import TableSpec
from tdreplay.storage.errors import SchemaError

from . import errors, tuning
from .bodies import BodyBuffers, BodyDecoder
from .metrics import Metrics, MetricsMiddleware
from .registry import Registry
from .routes import data, health, persistence, tables
from .security import BearerAuth
from .settings import Settings

log = logging.getLogger("tdreplay.service")

VERSION = "0.1.0"


def load_specs(settings: Settings) -> list[TableSpec]:
    """The schemas under ``settings.schema_path``, with the settings' backend override applied.

    Raises:
        SchemaError: a schema is invalid, or the path does not exist.
    """
    path = settings.schema_path
    if path is None:
        return []
    path = Path(path)
    if path.is_dir():
        specs = TableSpec.from_dir(path)
    elif path.exists():
        specs = [TableSpec.from_file(path)]
    else:
        raise SchemaError(f"{path}: no such schema file or folder")
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SchemaError(f"{path}: several schemas declare table {dupes[0]!r}", field="name")
    return [_override_backend(s, settings) for s in specs]


def _override_backend(spec: TableSpec, settings: Settings) -> TableSpec:
    kind = settings.backend or ("redis" if settings.redis_url else None)
    if kind is None:
        return spec
    block: dict[str, object] = {"kind": kind}
    if kind == "redis":
        url = urlparse(settings.redis_url or "")
        block.update(
            host=url.hostname or "localhost",
            port=url.port or 6379,
            db=int(url.path.strip("/") or 0),
        )
    data = spec.model_dump(mode="json")
    data["backend"] = block
    return TableSpec.parse(data, source=f"{spec.name} (backend {kind})")


def checkpoints_under(root: Path) -> list[str]:
    """Tables with a checkpoint in ``<root>/checkpoints/<name>``."""
    folder = root / protocol.CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / "metadata.json").exists())


async def load_tables(registry: Registry, settings: Settings) -> None:
    """Create the schemas' tables; with ``settings.restore``, restore checkpoints instead."""
    specs = load_specs(settings)
    restored = set()
    if settings.restore:
        for name in checkpoints_under(registry.root):
            await registry.restore(name)
            restored.add(name)
            log.info("table %r restored from %s", name, registry.checkpoint_path(name))
    for spec in specs:
        if spec.name not in restored:
            await registry.create(spec)
            log.info(
                "table %r created (%s, capacity %d)", spec.name, spec.backend.kind, spec.capacity
            )


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
                await state.registry.close(checkpoint=settings.checkpoint_on_shutdown)

    async def _start(app: FastAPI) -> None:
        tuning.apply(settings)
        registry: Registry = app.state.registry
        registry.root.mkdir(parents=True, exist_ok=True)
        try:
            await load_tables(registry, settings)
        except BaseException:
            await registry.close()
            raise
        app.state.ready = True

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
    )
    metrics = Metrics(lambda: app.state.registry.handles())
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.registry = Registry(settings, on_wait=metrics.waited)
    app.state.bodies = BodyBuffers(per_class=settings.pooled_buffers)
    app.state.decoder = BodyDecoder()
    app.state.ready = False
    app.state.lifespans = 0
    errors.install(app)
    for module in (data, tables, persistence, health):  # hot routes first: matched in order
        app.include_router(module.router)
    if settings.token_bytes:
        app.add_middleware(BearerAuth, token=settings.token_bytes)
        _declare_bearer(app)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: counts 401s too
    return app


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
