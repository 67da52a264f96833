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

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from prometheus_client import Counter
from starlette.concurrency import run_in_threadpool

from tdreplay.codec import protocol
from tdreplay.storage import (
    SchemaError,
    TableNotFound,
    TableSpec,
    TDReplayError,
    checkpoint_table,
    clean_checkpoints,
    is_checkpoint_debris,
    is_complete_checkpoint,
    lock_root,
    stored_specs,
)

from . import errors, tuning
from .bodies import BodyBuffers, BodyDecoder
from .metrics import Metrics, MetricsMiddleware
from .registry import Registry
from .routes import data, health, persistence, tables
from .security import BearerAuth
from .settings import Settings, is_loopback

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
    kind = settings.backend
    if kind is None:
        return spec
    data = spec.model_dump(mode="json")
    data["backend"] = {"kind": kind}  # redis: the operator's "default" connection
    return TableSpec.parse(data, source=f"{spec.name} (backend {kind})")


def checkpoints_under(root: Path) -> list[str]:
    """Tables with a complete checkpoint in ``<root>/checkpoints/<name>``.

    What interrupted checkpoints leave (``<name>.tmp-<hex>``, ``<name>.old-<hex>``)
    is not a table, whatever it holds.
    """
    folder = root / protocol.CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(
        p.name
        for p in folder.iterdir()
        if not is_checkpoint_debris(p.name)
        and "." not in p.name
        and is_complete_checkpoint(p)
        and checkpoint_table(p) == p.name  # a named checkpoint of another table is not one
    )


#: backends whose tables ``--checkpoint-every`` checkpoints: their rows live in the
#: process (memory, shared), in a file a crash can leave torn (h5), or on a Redis whose
#: persistence tdreplay cannot see (redis). memmap tables are reopened from their own
#: files after a crash (storage/durable.py).
PERIODIC_BACKENDS = frozenset({"memory", "shared", "h5", "redis"})


class PeriodicCheckpoints:
    """Checkpoint the tables on :data:`PERIODIC_BACKENDS` every ``every`` seconds.

    Each to its default path (``<root>/checkpoints/<name>``), one table after the
    other, the next round ``every`` seconds after the previous one ended. A
    failed checkpoint is logged and counted (``tdreplay_periodic_checkpoints``
    on ``/metrics``, and :attr:`failures`); it never stops the server or the
    task. :meth:`stop` lets a checkpoint under way finish.
    """

    def __init__(self, registry: Registry, every: float, metrics: Metrics) -> None:
        self.registry = registry
        self.every = every
        self.done = 0
        self.failures = 0
        self._counter = Counter(
            "tdreplay_periodic_checkpoints",
            "Checkpoints written by --checkpoint-every, by outcome.",
            ["table", "outcome"],
            registry=metrics.registry,
        )
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="tdreplay-periodic-checkpoints")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.every)
                return
            except TimeoutError:
                pass
            await self.round()

    async def round(self) -> None:
        """Checkpoint every table on :data:`PERIODIC_BACKENDS` once."""
        for handle in self.registry.handles():
            if self._stop.is_set():
                return
            if handle.table.spec.backend.kind not in PERIODIC_BACKENDS:
                continue
            try:
                await self.registry.checkpoint(handle.name)
            except TableNotFound:  # deleted since the round began
                continue
            except Exception:
                self.failures += 1
                self._counter.labels(handle.name, "failed").inc()
                log.exception("periodic checkpoint of table %r failed", handle.name)
            else:
                self.done += 1
                self._counter.labels(handle.name, "ok").inc()


async def load_tables(registry: Registry, settings: Settings) -> None:
    """Bring the tables back, newest data first, then create the schemas' new ones.

    1. Memmap tables left under ``<root>/tables/`` are reopened with every row
       acknowledged before the last process ended (crash included); a schema of
       the same name must describe the same table (else the start fails: the
       data is kept, never replaced behind the operator's back).
    2. With ``settings.restore``, the checkpoints of tables not reopened are restored.
    3. The schemas' tables still missing are created (dead data an earlier
       non-durable table of the same name left in its folder is replaced).
    """
    specs = load_specs(settings)
    wanted = {spec.name: spec for spec in specs}
    loaded = set()
    failed = registry.failed  # name -> why: not served, data kept (shown by /readyz)
    for stored in await run_in_threadpool(stored_specs, registry.root, failed):
        schema = wanted.get(stored.name)
        if schema is not None and schema != stored:
            why = (
                f"its data under {registry.root / 'tables'} was written under another schema than "
                f"{settings.schema_path}'s (capacity {stored.capacity} vs {schema.capacity}, "
                f"backend {stored.backend.kind} vs {schema.backend.kind}); it is kept: serve the "
                "old schema, or move the folder away"
            )
            log.error("table %r not served: %s", stored.name, why)
            failed[stored.name] = why
            continue
        try:
            handle = await registry.open(stored)
        except TDReplayError as err:
            # One damaged table must not keep the others from being served; its data is kept.
            log.error("table %r not reopened, its data is kept as it is: %s", stored.name, err)
            failed[stored.name] = str(err)
            continue
        loaded.add(stored.name)
        log.info("table %r reopened from disk (%d rows)", stored.name, handle.table.size)
    if settings.restore:
        for name in checkpoints_under(registry.root):
            if name in loaded:
                log.info("table %r: its data on disk is newer than its checkpoint", name)
                continue
            try:
                await registry.restore(name)
            except TDReplayError as err:
                log.error("table %r not restored, its checkpoint is kept as it is: %s", name, err)
                failed[name] = str(err)
                continue
            loaded.add(name)
            log.info("table %r restored from %s", name, registry.checkpoint_path(name))
    for spec in specs:
        if spec.name in failed:
            continue  # its data (on disk, in its checkpoint) waits for the operator
        if spec.name not in loaded:
            await registry.create(spec, replace=True)
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
                await _stop(app)

    async def _start(app: FastAPI) -> None:
        tuning.apply(settings)
        registry: Registry = app.state.registry
        # First, before anything under the root is touched: a second server here
        # would delete the first one's tables.
        app.state.root_lock = lock_root(registry.root)
        try:
            clean_checkpoints(registry.root / protocol.CHECKPOINTS)
            await load_tables(registry, settings)
        except BaseException:
            await registry.close()
            app.state.root_lock.close()
            app.state.root_lock = None
            raise
        if settings.checkpoint_every:
            periodic = PeriodicCheckpoints(registry, settings.checkpoint_every, app.state.metrics)
            periodic.start()
            app.state.periodic = periodic
            log.info(
                "checkpointing the %s tables every %g s",
                "/".join(sorted(PERIODIC_BACKENDS)),
                settings.checkpoint_every,
            )
        app.state.ready = True

    async def _stop(app: FastAPI) -> None:
        state = app.state
        try:
            if state.periodic is not None:
                await state.periodic.stop()
                state.periodic = None
            await state.registry.close(checkpoint=settings.checkpoint_on_shutdown)
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
    )
    metrics = Metrics(lambda: app.state.registry.handles())
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.registry = Registry(settings, on_wait=metrics.waited)
    app.state.bodies = BodyBuffers(per_class=settings.pooled_buffers)
    app.state.decoder = BodyDecoder()
    app.state.ready = False
    app.state.lifespans = 0
    app.state.periodic = None
    app.state.root_lock = None
    errors.install(app)
    for module in (data, tables, persistence, health):  # hot routes first: matched in order
        app.include_router(module.router)
    if settings.token_bytes:
        app.add_middleware(BearerAuth, token=settings.token_bytes)
        _declare_bearer(app)
    elif not is_loopback(settings.host):  # only with --insecure: Settings refuses it otherwise
        log.warning(
            "serving %s with no token (--insecure): whoever reaches the port may read, write "
            "and delete every table",
            settings.host,
        )
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
