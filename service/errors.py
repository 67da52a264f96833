"""The one place errors become HTTP responses.

Every error body is ``{"type", "detail", "field", ...}`` (see
:mod:`tdreplay.codec.protocol`) with the status its class carries: the errors
are the one hierarchy of :mod:`tdreplay.codec.errors`, which the storage
raises, the server answers with and the client raises again.
Anything else is an ``InternalError`` 500 whose body says nothing about the
cause; the traceback goes to the server log.

An answer never says where the server keeps its files: every spelling of the data
root in an error's text becomes ``<root>`` (:func:`hide_root`), so a client reads
``<root>/checkpoints/x/metadata.json is not valid JSON`` and learns the file inside
the root, never the root's place on the server. Errors are answered through
:func:`error_body` on every door (HTTP and the same-host socket); the server's log
keeps the full paths for the operator.

    >>> hide_root("no checkpoint at /srv/td/checkpoints/x", Path("/srv/td"))
    'no checkpoint at <root>/checkpoints/x'
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from tdreplay.codec.errors import (
    Forbidden,
    InternalError,
    InvalidRequest,
    PayloadTooLarge,
    SchemaError,
    TDReplayError,
    Unauthorized,
    UnsupportedMediaType,
    status_of,
)
from tdreplay.codec.params import broken_rule
from tdreplay.codec.text import json_failure, printable

log = logging.getLogger("tdreplay.service")


__all__ = [
    "Forbidden",
    "InternalError",
    "PayloadTooLarge",
    "Unauthorized",
    "UnsupportedMediaType",
    "error_body",
    "error_response",
    "hide_root",
    "install",
    "status_of",
]


#: what an answer names the data root by
ROOT = "<root>"


def hide_root(text: str, root: Path) -> str:
    """``text`` with every spelling of the data root ``root`` (as configured, and with its
    links resolved) written ``<root>``: what a client may read of a server path."""
    for spelling in sorted({str(root), os.path.realpath(root)}, key=len, reverse=True):
        if spelling != os.sep:
            text = text.replace(spelling, ROOT)
    return text


def error_body(exc: BaseException, root: Path) -> dict[str, Any]:
    """The JSON body of an error answer, on any door: paths relative to the data root
    ``root`` (see :func:`hide_root`)."""
    if not isinstance(exc, TDReplayError):
        return InternalError("internal server error").to_dict()
    body = exc.to_dict()
    return {k: hide_root(v, root) if isinstance(v, str) else v for k, v in body.items()}


def error_response(
    exc: BaseException, root: Path, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(exc, root), status_code=status_of(exc), headers=headers)


#: route names whose JSON body is a table schema: a body that fails validation is a SchemaError
SCHEMA_BODY_ROUTES = {"create_table"}


def _validation_error(request: Request, exc: RequestValidationError) -> TDReplayError:
    errors = exc.errors()
    ruled = broken_rule(list(errors))
    if ruled is not None:
        return ruled
    first: dict[str, Any] = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":  # loc is ("body", <character>), not a field
        at = first.get("loc", ())[1:]
        why = str((first.get("ctx") or {}).get("error") or first.get("msg"))
        position = f" at character {at[0]}" if at else ""
        return InvalidRequest(f"invalid JSON body: {why}{position}", field="body")
    loc = [str(p) for p in first.get("loc", ())]
    where = loc[0] if loc else ""
    field = ".".join(loc[1:]) or None
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or where}: {e.get('msg')}"
        for e in errors[:10]
    )
    route = request.scope.get("route")
    if (
        where == "body"
        and getattr(route, "name", None) in SCHEMA_BODY_ROUTES
        and first.get("type") != "json_invalid"
    ):
        return SchemaError(f"invalid table schema: {problems}", field=field)
    return InvalidRequest(f"invalid {where or 'request'}: {problems}", field=field)


def install(app: FastAPI, root: Path) -> None:
    """Register the handlers that turn every error into ``{"type", "detail", "field"}``,
    naming the server's files relative to the data root ``root``."""

    async def on_tdreplay(request: Request, exc: Exception) -> JSONResponse:
        status = status_of(exc)
        if status >= 500:
            # the path is the client's text: escaped, it cannot forge or recolour log lines
            where = printable(request.url.path)
            log.error("%s %s failed: %s", request.method, where, printable(str(exc)))
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else {}
        if isinstance(exc, TDReplayError) and exc.retry_after is not None:
            headers["Retry-After"] = str(exc.retry_after)
        return error_response(exc, root, headers or None)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(_validation_error(request, exc), root)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, (RecursionError, ValueError)):
            # the framework could not decode a JSON body ("There was an error parsing the
            # body"): say why
            err = InvalidRequest(f"invalid JSON body: {json_failure(cause)}", field="body")
            return error_response(err, root)
        # no route, or a method the route does not take: the protocol's InvalidRequest, with
        # the status Starlette chose (404, 405)
        if exc.status_code == 404:
            detail = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow")
            detail = f"{request.method} is not allowed on {request.url.path}" + (
                f" (it takes {allowed})" if allowed else ""
            )
        else:
            detail = str(exc.detail)
        body = InvalidRequest(detail).to_dict()
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, printable(request.url.path), exc_info=exc)
        return error_response(InternalError("internal server error"), root)

    app.add_exception_handler(TDReplayError, on_tdreplay)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
