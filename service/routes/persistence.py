"""Persistence: checkpoint, restore, export; dump and load (a checkpoint over the wire).

Paths are relative to the data root and stay in its server-owned areas (the
rules: :mod:`tdreplay.service.core.paths`). ``dump`` answers a fresh checkpoint
as one archive and ``load`` restores from one (:mod:`tdreplay.codec.archive`),
so a client keeps a table's whole state on its own side.
"""

from __future__ import annotations

import contextlib
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask

from tdreplay.codec import protocol
from tdreplay.codec.operations import CHECKPOINT, DUMP, EXPORT, LOAD, RESTORE, ExportBody, PathBody
from tdreplay.storage import (
    BackendError,
    CheckpointError,
    InsufficientStorage,
    InvalidCheckpoint,
    PathExists,
    SchemaError,
    TableNotFound,
)

from ..bodies import read_body
from ..deps import CoreDep, TableName, declare, error_responses, require_media_type
from ..errors import PayloadTooLarge, UnsupportedMediaType

router = APIRouter(tags=["persistence"])


class PathResult(BaseModel):
    path: str = Field(description="Relative to the data root.")


@declare(
    router,
    CHECKPOINT,
    response_model=PathResult,
    responses=error_responses(TableNotFound, PathExists, CheckpointError),
)
async def checkpoint(
    name: TableName, core: CoreDep, body: PathBody | None = None
) -> dict[str, str]:
    """Write the table's data and state to a folder, atomically (inserts and samples go on meanwhile)."""
    return {"path": await core.checkpoint(name, body or PathBody())}


@declare(
    router,
    RESTORE,
    responses=error_responses(InvalidCheckpoint, SchemaError, CheckpointError, BackendError),
)
async def restore(name: TableName, core: CoreDep, body: PathBody | None = None) -> dict[str, Any]:
    """Replace the table (or create it) from a checkpoint of it. Answers its info."""
    return await core.restore(name, body or PathBody())


@declare(
    router,
    EXPORT,
    response_model=None,
    responses={
        200: {
            "description": "With a path: {'path': ...} (Minari: the dataset's folder). "
            "Without: the file.",
            "content": {
                protocol.JSON: {"schema": PathResult.model_json_schema()},
                protocol.PARQUET: {"schema": {"type": "string", "format": "binary"}},
                protocol.CSV: {"schema": {"type": "string"}},
            },
        },
        **error_responses(TableNotFound, PathExists, BackendError, SchemaError),
    },
)
async def export(
    name: TableName, core: CoreDep, body: ExportBody | None = None
) -> JSONResponse | FileResponse:
    """Export the live items, oldest first, as Parquet or CSV: written under the data root, or sent back;
    or as a Minari dataset (format minari, dataset_id), written under the datasets root path."""
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


@declare(
    router,
    DUMP,
    response_class=FileResponse,
    responses={
        200: {
            "description": "A fresh checkpoint of the table as a tar archive.",
            "content": {protocol.TAR: {"schema": {"type": "string", "format": "binary"}}},
        },
        **error_responses(TableNotFound, CheckpointError, InsufficientStorage),
    },
)
async def dump(name: TableName, core: CoreDep) -> FileResponse:
    """The table's data and state (a fresh checkpoint) as one archive, for ``load`` to restore."""
    archive = await core.dump(name)

    def cleanup() -> None:
        with contextlib.suppress(OSError):
            archive.unlink()

    return FileResponse(
        archive,
        media_type=protocol.TAR,
        filename=f"{name}.tar",
        background=BackgroundTask(cleanup),
    )


@declare(
    router,
    LOAD,
    responses=error_responses(
        "CodecError",
        InvalidCheckpoint,
        SchemaError,
        CheckpointError,
        BackendError,
        PayloadTooLarge,
        UnsupportedMediaType,
    ),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {protocol.TAR: {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def load(request: Request, name: TableName, core: CoreDep) -> dict[str, Any]:
    """Replace (or create) the table from an archive ``dump`` made of it (at most
    ``--max-body-bytes``). Answers its info."""
    require_media_type(request, protocol.TAR)
    body = await read_body(request, request.app.state.bodies, core.settings.max_body_bytes)
    return await core.load(name, body)
