"""What the routers share: the core as a dependency, the media-type check, the OpenAPI bits they repeat."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict

from tdreplay.codec.operations import Operation
from tdreplay.codec.protocol import ARROW_STREAM, ERROR_STATUS
from tdreplay.storage import MAX_TABLE_NAME, TDReplayError

from .core import Core
from .errors import UnsupportedMediaType


def get_core(request: Request) -> Core:
    return request.app.state.core


CoreDep = Annotated[Core, Depends(get_core)]
TableName = Annotated[
    str, Path(description="The table's name.", max_length=MAX_TABLE_NAME, examples=["cartpole"])
]


def require_media_type(request: Request, media_type: str) -> None:
    """Raise :class:`UnsupportedMediaType` (415) unless the body is declared as ``media_type``."""
    got = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if got != media_type:
        raise UnsupportedMediaType(
            f"the body must be {media_type}, got {got or 'no Content-Type'!r}",
            field="Content-Type",
            expected=media_type,
            got=got or None,
        )


class ErrorBody(BaseModel):
    """Every error answer: the error class, a message quoting the bad value, the field at fault."""

    model_config = ConfigDict(extra="allow")
    type: str
    detail: str
    field: str | None = None


def error_responses(*types: type[TDReplayError] | str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the errors a route may answer (plus 400, 401 and 500 always)."""
    names = {t if isinstance(t, str) else t.__name__ for t in types}
    names |= {"InvalidRequest", "Unauthorized", "InternalError"}
    out: dict[int | str, dict[str, Any]] = {}
    for name in sorted(names):
        status = ERROR_STATUS[name]
        entry = out.setdefault(status, {"model": ErrorBody, "description": ""})
        entry["description"] = ", ".join(filter(None, [entry["description"], name]))
    return out


ARROW_SCHEMA = {"type": "string", "format": "binary"}
ARROW_REQUEST: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "An Arrow IPC stream holding one record batch; nested keys joined with '.'.",
        "content": {ARROW_STREAM: {"schema": ARROW_SCHEMA}},
    }
}


def arrow_response(description: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"description": description, "content": {ARROW_STREAM: {"schema": ARROW_SCHEMA}}}}


def declare(router: APIRouter, op: Operation, **kw: Any) -> Callable[[Callable[..., Any]], Any]:
    """Declare the endpoint of operation ``op`` on ``router``: its route, method and name
    come from the contract (:data:`tdreplay.codec.operations.OPERATIONS`), the rest
    (answers, errors, OpenAPI extras) from ``kw``."""
    return router.api_route(op.route, methods=[op.method], name=op.name, **kw)
