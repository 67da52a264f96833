"""Running the server from :class:`~.settings.Settings` until interrupted: :func:`run`.

:func:`run` loads the schemas (a bad one stops it before anything listens),
tunes the process, builds the app (:func:`~.app.create_app`) and serves it
with uvicorn (:func:`config`) and the limits of :mod:`.server`. It raises what stops the server
and prints nothing: how a failure is reported (one line, an exit status) is
the command line's (``tdreplay serve``, :mod:`tdreplay.cli`), as is how logs
are written. What stops the app while it starts (its lifespan: a data root
another server holds, a socket that cannot be listened on, ...; or uvicorn's
listening socket: a port in use) is raised from :func:`run`, not logged by
uvicorn as a traceback or a line of its own with its exit status 3.

    >>> from tdreplay.service import Settings
    >>> from tdreplay.service.runner import run
    >>> run(Settings(schema_path="cartpole", root="./data"))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
import resource
from typing import Any

import uvicorn
from fastapi import FastAPI

from tdreplay import schemas

from . import tuning
from .app import create_app
from .core import load_specs
from .limits import Limits, Receiving
from .server import LimitedHttpProtocol
from .settings import Settings

log = logging.getLogger("tdreplay.service")


def run(settings: Settings) -> None:
    """Serve the tables of ``settings`` until interrupted.

    A ``schema_path`` that does not exist names a shipped schema
    (:func:`with_shipped_schemas`).

    Raises:
        SchemaError: a schema is invalid, a path does not exist, or two schemas declare
            one table (:func:`~.core.load_specs`) - before the server starts.
        Exception: what stopped the app's start (its lifespan): a data root another
            server holds, a socket that cannot be listened on, ...
        OSError: the address cannot be listened on (a port in use, ...).
    """
    shipped = with_shipped_schemas(settings)
    if shipped is not settings:
        log.info("serving the shipped schema(s) %s", shipped.schema_path)
    load_specs(shipped)  # a bad schema stops here, with its message, before the server starts
    tuning.pin_malloc(shipped.malloc_mmap_threshold, shipped.malloc_trim_threshold)
    serve_app(create_app(shipped), shipped)


def with_shipped_schemas(settings: Settings) -> Settings:
    """``settings`` with each ``schema_path`` that does not exist resolved to a shipped schema.

    ``--schema cartpole`` (or ``schemas/cartpole.yaml``, ``schemas/`` run from
    outside a checkout) serves the schema installed with tdreplay.
    """
    paths = [p if p.exists() else schemas.resolve(p) for p in settings.schema_path]
    if paths == settings.schema_path:
        return settings
    return settings.model_copy(update={"schema_path": paths})


def raise_fd_limit(connections: int, spare: int = 256) -> None:
    """Raise the soft open-files limit to fit ``connections`` plus ``spare`` descriptors.

    The hard limit bounds it; when even that is too low a warning says so
    (connections past it fail at ``accept`` rather than get a 503).
    """
    want = connections + spare
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning(
            "open-files limit %d is below --max-connections %d plus %d spare descriptors; "
            "lower --max-connections or raise the limit (ulimit -n)",
            soft,
            connections,
            spare,
        )


def serve_app(app: FastAPI, settings: Settings) -> None:
    """Serve ``app`` (:func:`~.app.create_app`'s) until interrupted.

    Raises:
        Exception: what stopped the app's start (its lifespan): a data root another
            server holds, a socket that cannot be listened on, ... - raised here, for
            the command to say in one line, instead of uvicorn's traceback and exit.
        OSError: the address cannot be listened on (a port in use, ...).
    """
    raise_fd_limit(settings.max_connections)
    failed: list[Exception] = []
    receiving = app.state.core.receiving  # the bodies its core holds count with those received
    server = uvicorn.Server(config(_start_reported(app, failed), settings, receiving))
    unbound = _Unbound(server, failed)
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(unbound)
    try:
        server.run()
    except SystemExit:
        if failed:
            raise failed[0] from None
        raise
    finally:
        uvicorn_log.removeFilter(unbound)


def protocol_class(limits: Limits, receiving: Receiving) -> type[LimitedHttpProtocol]:
    """A :class:`LimitedHttpProtocol` bound to ``limits`` and ``receiving`` (one per connection)."""
    members = {"limits": limits, "receiving": receiving}
    return type("LimitedHttpProtocol", (LimitedHttpProtocol,), members)


def config(app: Any, settings: Settings, receiving: Receiving) -> uvicorn.Config:
    """The uvicorn configuration that serves ``app`` with ``settings``' address and limits
    (``receiving``: the app core's count of request bodies held)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol_class(Limits.from_settings(settings), receiving),
        ws="none",  # no WebSocket routes: no upgrade path around the limits
        log_level=settings.log_level,
        access_log=settings.access_log,
        server_header=False,
        # typed int, but uvicorn only hands it to loop.call_later: a float works
        timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]
        timeout_graceful_shutdown=math.ceil(settings.shutdown_timeout),
    )


class _Unbound(logging.Filter):
    """Takes the error uvicorn logs when it cannot listen (it logs the ``OSError`` itself,
    then exits with its status 3) while the server starts: kept in ``failed`` for
    :func:`serve_app` to raise, not logged."""

    def __init__(self, server: uvicorn.Server, failed: list[Exception]) -> None:
        super().__init__()
        self.server, self.failed = server, failed

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, OSError) and not self.server.started:
            self.failed.append(record.msg)
            return False
        return True


def _start_reported(app: Any, failed: list[Exception]) -> Any:
    """``app``, whose failure to start is put in ``failed`` rather than sent to uvicorn as
    a traceback to log (uvicorn still stops)."""

    async def served(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            return await app(scope, receive, send)

        async def told(message: Any) -> None:
            if message["type"] == "lifespan.startup.failed":
                message = {"type": message["type"], "message": ""}
            await send(message)

        try:
            await app(scope, receive, told)
        except Exception as err:
            failed.append(err)
            raise

    return served
