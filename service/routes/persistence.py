"""Persistence: checkpoint, restore, export.

Paths are relative to the data root and stay in its server-owned areas: a
checkpoint or restore path inside ``checkpoints/``, an export path inside
``exports/``; the tables' own data (``tables/``) is out of reach. Nothing that
exists is overwritten unless it is ours: a checkpoint replaces only a
checkpoint of the same table, an export never replaces a file (409).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask

from tdreplay.codec import protocol
from tdreplay.storage import (
    BackendError,
    CheckpointError,
    InvalidCheckpoint,
    InvalidRequest,
    PathExists,
    SchemaError,
    TableNotFound,
    checkpoint_table,
    is_reserved_checkpoint_name,
)

from ..deps import RegistryDep, TableDep, TableName, error_responses
from ..registry import Registry
from ..security import confine_area, relative

#: the data root's area for exports written on the server (``exports/<file>``)
EXPORTS = "exports"

router = APIRouter(prefix=protocol.TABLES, tags=["persistence"])

#: folder under the data root for exports streamed back (deleted once sent)
EXPORT_SCRATCH = ".exports"


class PathBody(BaseModel):
    path: str | None = Field(
        default=None,
        max_length=1024,
        description="A folder relative to the data root, inside checkpoints/; "
        "default: checkpoints/{name}.",
    )


class PathResult(BaseModel):
    path: str = Field(description="Relative to the data root.")


class ExportBody(BaseModel):
    format: Literal["parquet", "csv"] = "parquet"
    path: str | None = Field(
        default=None,
        max_length=1024,
        description="A new file relative to the data root, inside exports/, to write "
        "(409 if it exists); omitted: the file is streamed back.",
    )


def _checkpoint_target(registry: Registry, name: str, given: str | None) -> Path:
    target = (
        registry.checkpoint_path(name)
        if given is None
        else confine_area(registry.root, protocol.CHECKPOINTS, given)
    )
    parts = target.relative_to((registry.root / protocol.CHECKPOINTS).resolve()).parts
    if any(is_reserved_checkpoint_name(part) for part in parts):
        raise InvalidRequest(
            f"path {given!r}: names like '<x>.tmp-<hex>' / '<x>.old-<hex>' are kept for "
            "interrupted checkpoints",
            table=name,
            field="path",
            got=given,
        )
    if len(parts) == 1 and parts[0] != name:
        # checkpoints/<x> is table x's default checkpoint (restored on start as table x)
        raise InvalidRequest(
            f"path {given!r}: checkpoints/{parts[0]} is the default checkpoint of table "
            f"{parts[0]!r}; "
            f"give checkpoints/{name} or a deeper path (checkpoints/<folder>/<name>)",
            table=name,
            field="path",
            got=given,
        )
    if os.path.lexists(target) and (target.is_symlink() or checkpoint_table(target) != name):
        raise PathExists(
            f"path {relative(registry.root, target)!r} exists and is not a checkpoint of "
            f"table {name!r}; it is left as it is (choose another path)",
            table=name,
            field="path",
            got=given,
        )
    return target


@router.post(
    "/{name}/checkpoint",
    name="checkpoint",
    response_model=PathResult,
    responses=error_responses(TableNotFound, PathExists, CheckpointError),
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
    responses=error_responses(InvalidCheckpoint, SchemaError, CheckpointError, BackendError),
)
async def restore(
    name: TableName, registry: RegistryDep, body: PathBody | None = None
) -> dict[str, Any]:
    """Replace the table (or create it) from a checkpoint of it. Answers its info."""
    given = body.path if body else None
    source = confine_area(registry.root, protocol.CHECKPOINTS, given) if given else None
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
        **error_responses(TableNotFound, PathExists, BackendError),
    },
)
async def export(
    handle: TableDep, registry: RegistryDep, body: ExportBody | None = None
) -> JSONResponse | FileResponse:
    """Export the live items, oldest first, as Parquet or CSV: written under the data root, or sent back."""
    body = body or ExportBody()
    if body.path is not None:
        target = confine_area(registry.root, EXPORTS, body.path)
        if os.path.lexists(target):
            raise PathExists(
                f"path {body.path!r} exists; an export never replaces a file (choose another path)",
                table=handle.name,
                field="path",
                got=body.path,
            )
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
