"""Persistence: checkpoint, restore, export.

Paths are relative to the data root and stay in its server-owned areas (the
rules: :mod:`tdreplay.service.core.paths`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask

from tdreplay.codec import protocol
from tdreplay.storage import (
    BackendError,
    CheckpointError,
    InvalidCheckpoint,
    PathExists,
    SchemaError,
    TableNotFound,
)

from ..core import ExportBody, PathBody
from ..deps import CoreDep, TableName, error_responses

router = APIRouter(prefix=protocol.TABLES, tags=["persistence"])


class PathResult(BaseModel):
    path: str = Field(description="Relative to the data root.")


@router.post(
    "/{name}/checkpoint",
    name="checkpoint",
    response_model=PathResult,
    responses=error_responses(TableNotFound, PathExists, CheckpointError),
)
async def checkpoint(
    name: TableName, core: CoreDep, body: PathBody | None = None
) -> dict[str, str]:
    """Write the table's data and state to a folder, atomically (inserts and samples go on meanwhile)."""
    return {"path": await core.checkpoint(name, body or PathBody())}


@router.post(
    "/{name}/restore",
    name="restore",
    responses=error_responses(InvalidCheckpoint, SchemaError, CheckpointError, BackendError),
)
async def restore(name: TableName, core: CoreDep, body: PathBody | None = None) -> dict[str, Any]:
    """Replace the table (or create it) from a checkpoint of it. Answers its info."""
    return await core.restore(name, body or PathBody())


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
    name: TableName, core: CoreDep, body: ExportBody | None = None
) -> JSONResponse | FileResponse:
    """Export the live items, oldest first, as Parquet or CSV: written under the data root, or sent back."""
    body = body or ExportBody()
    path, scratch = await core.export(name, body)
    if not scratch:
        return JSONResponse({"path": core.relative(path)})

    def cleanup() -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    return FileResponse(
        path,
        media_type=protocol.EXPORT_MEDIA[body.format],
        filename=f"{name}.{body.format}",
        background=BackgroundTask(cleanup),
    )
