"""Dependency aliases shared by the routers, and the OpenAPI bits they repeat."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict

from tdreplay.codec.protocol import ARROW_STREAM, ERROR_STATUS
from tdreplay.storage import TDReplayError

from .errors import UnsupportedMediaType
from .registry import Registry, TableHandle
from .settings import Settings


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_registry(request: Request) -> Registry:
    return request.app.state.registry


SettingsDep = Annotated[Settings, Depends(get_settings)]
RegistryDep = Annotated[Registry, Depends(get_registry)]
TableName = Annotated[
    str, Path(description="The table's name.", max_length=64, examples=["cartpole"])
]
Timeout = Annotated[
    float | None,
    Query(
        ge=0,
        description="Seconds to wait for the rate limiter before answering 429 "
        "(default: the server's default timeout; capped by its maximum).",
    ),
]
BatchSize = Annotated[int, Query(ge=1, le=1 << 31, description="Items per batch.")]


async def get_table(name: TableName, registry: RegistryDep) -> TableHandle:
    return registry.get(name)


TableDep = Annotated[TableHandle, Depends(get_table)]


def resolve_timeout(settings: Settings, timeout: float | None) -> float:
    """The client's timeout, or the server's default, capped by the server's maximum."""
    return min(settings.default_timeout if timeout is None else timeout, settings.max_timeout)


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
