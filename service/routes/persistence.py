"""Persistence: checkpoint, restore, export. Paths are relative to the data root and stay in it."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask

from tdreplay.codec import protocol
from tdreplay.storage.errors import (
    BackendError,
    CheckpointError,
    InvalidRequest,
    TableNotFound,
)

from ..deps import RegistryDep, TableDep, TableName, error_responses
from ..registry import Registry
from ..security import check_clear_of, confine, relative

router = APIRouter(prefix=protocol.TABLES, tags=["persistence"])

#: folder under the data root for exports streamed back (deleted once sent)
EXPORT_SCRATCH = ".exports"


class PathBody(BaseModel):
    path: str | None = Field(
        default=None,
        max_length=1024,
        description="A folder relative to the data root; default: checkpoints/{name}.",
    )


class PathResult(BaseModel):
    path: str = Field(description="Relative to the data root.")


class ExportBody(BaseModel):
    format: Literal["parquet", "csv"] = "parquet"
    path: str | None = Field(
        default=None,
        max_length=1024,
        description="A file relative to the data root to write; omitted: the file is streamed back.",
    )


def _checkpoint_target(registry: Registry, name: str, given: str | None) -> Path:
    if given is None:
        return registry.checkpoint_path(name)
    target = confine(registry.root, given)
    check_clear_of(target, registry.storage_paths(), given=given, field="path")
    replaces_other = target.exists() and not (target / "metadata.json").exists()
    if replaces_other and (not target.is_dir() or any(target.iterdir())):
        raise InvalidRequest(
            f"path {given!r} exists and is not a checkpoint; it would be replaced",
            field="path",
            got=given,
        )
    return target


@router.post(
    "/{name}/checkpoint",
    name="checkpoint",
    response_model=PathResult,
    responses=error_responses(TableNotFound, CheckpointError),
)
async def checkpoint(
    name: TableName, registry: RegistryDep, body: PathBody | None = None
) -> dict[str, str]:
    """Write the table's data and state to a folder, atomically (inserts and samples wait meanwhile)."""
    registry.get(name)
    target = _checkpoint_target(registry, name, body.path if body else None)
    path = await registry.checkpoint(name, target)
    return {"path": relative(registry.root, path)}


@router.post(
    "/{name}/restore",
    name="restore",
    responses=error_responses(CheckpointError, BackendError),
)
async def restore(
    name: TableName, registry: RegistryDep, body: PathBody | None = None
) -> dict[str, Any]:
    """Replace the table (or create it) from a checkpoint of it. Answers its info."""
    given = body.path if body else None
    source = confine(registry.root, given) if given is not None else None
    handle = await registry.restore(name, source)
    return await handle.info()


@router.post(
    "/{name}/export",
    name="export",
    response_model=None,
    responses={
        200: {
            "description": "With a path: {'path': ...}. Without: the file.",
            "content": {
                protocol.JSON: {"schema": PathResult.model_json_schema()},
                protocol.PARQUET: {"schema": {"type": "string", "format": "binary"}},
                protocol.CSV: {"schema": {"type": "string"}},
            },
        },
        **error_responses(TableNotFound, BackendError),
    },
)
async def export(
    handle: TableDep, registry: RegistryDep, body: ExportBody | None = None
) -> JSONResponse | FileResponse:
    """Export the live items, oldest first, as Parquet or CSV: written under the data root, or sent back."""
    body = body or ExportBody()
    if body.path is not None:
        target = confine(registry.root, body.path)
        check_clear_of(target, registry.storage_paths(), given=body.path, field="path")
        fmt = body.format
        with handle.use() as table:
            path = await handle.call(lambda: table.export(target, format=fmt))
        return JSONResponse({"path": relative(registry.root, path)})
    scratch = registry.root / EXPORT_SCRATCH / f"{handle.name}-{uuid.uuid4().hex}.{body.format}"
    fmt = body.format
    with handle.use() as table:
        path = await handle.call(lambda: table.export(scratch, format=fmt))

    def cleanup() -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    return FileResponse(
        path,
        media_type=protocol.EXPORT_MEDIA[body.format],
        filename=f"{handle.name}.{body.format}",
        background=BackgroundTask(cleanup),
    )
