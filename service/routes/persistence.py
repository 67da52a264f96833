"""Persistence: checkpoint, restore, export; dump and load (a checkpoint over the wire).

Paths are relative to the data root and stay in its server-owned areas (the
rules: :mod:`tdreplay.service.core.paths`). ``dump`` answers a fresh checkpoint
as one archive and ``load`` restores from one (:mod:`tdreplay.codec.archive`),
so a client keeps a table's whole state on its own side.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from tdreplay.codec import protocol
from tdreplay.codec.archive import CHUNK as ARCHIVE_CHUNK
from tdreplay.codec.exports import export_format
from tdreplay.codec.operations import (
    CHECKPOINT,
    DUMP,
    EXPORT,
    LOAD,
    LOAD_ABORT,
    LOAD_BEGIN,
    LOAD_COMMIT,
    LOAD_PART,
    RESTORE,
)
from tdreplay.codec.params import (
    ExportBody,
    LoadBeginParams,
    LoadPartParams,
    LoadUpload,
    PathBody,
)
from tdreplay.storage import (
    BackendError,
    CheckpointError,
    InsufficientStorage,
    InvalidCheckpoint,
    InvalidRequest,
    PathExists,
    SchemaError,
    TableNotFound,
)

from ..bodies import read_body
from ..deps import CoreDep, TableName, declare, error_responses, require_media_type
from ..errors import PayloadTooLarge, UnsupportedMediaType
from ..streaming import ClosingStream

router = APIRouter(tags=["persistence"])


class PathResult(BaseModel):
    path: str = Field(description="Relative to the data root.")


class ExportResult(PathResult):
    rows: int = Field(description="The rows written.")
    skipped: int = Field(
        description="Rows live when the export began but overwritten or removed before "
        "they were read: left out (a table filling fast)."
    )
    splits: int | None = Field(
        default=None,
        description="Minari: where an episode was split because rows were missing inside it.",
    )


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
            "description": "With a path: {'path', 'rows', 'skipped'} (Minari: the dataset's "
            "folder, and 'splits'). Without: the file, its rows and skipped rows in the "
            f"{protocol.EXPORT_ROWS} and {protocol.EXPORT_SKIPPED} headers.",
            "content": {
                protocol.JSON: {"schema": ExportResult.model_json_schema()},
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
    path, slot = await core.export(name, body)
    counts = {"rows": path.rows, "skipped": path.skipped}
    if slot is None:
        splits = {} if path.splits is None else {"splits": path.splits}
        return JSONResponse({"path": core.relative(path), **counts, **splits})

    def cleanup() -> None:  # the scratch copy, and with it the export's --max-exports slot
        with contextlib.suppress(OSError):
            path.unlink()
        slot.give()

    fmt = export_format(path)  # the core named the scratch file for its format
    return ScratchFileResponse(
        path,
        media_type=protocol.EXPORT_MEDIA[fmt],
        filename=f"{name}.{fmt}",
        headers={protocol.EXPORT_ROWS: str(path.rows), protocol.EXPORT_SKIPPED: str(path.skipped)},
        background=BackgroundTask(cleanup),
    )


class ScratchFileResponse(FileResponse):
    """A scratch file sent and then deleted (its background task), also when the answer
    ends early: Starlette's runs the task only after an answer it finished."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task, self.background = self.background, None  # run here, once, whatever happens
        try:
            await super().__call__(scope, receive, send)
        finally:
            if task is not None:
                await task()


@declare(
    router,
    DUMP,
    response_class=ClosingStream,
    responses={
        200: {
            "description": "A fresh checkpoint of the table as a tar archive.",
            "content": {protocol.TAR: {"schema": {"type": "string", "format": "binary"}}},
        },
        **error_responses(TableNotFound, CheckpointError, InsufficientStorage),
    },
)
async def dump(name: TableName, core: CoreDep) -> ClosingStream:
    """The table's data and state (a fresh checkpoint) as one archive, for ``load`` to restore."""
    packed = await core.dump(name)

    def cleanup() -> None:  # run after the answer, and after a client gone midway (tested)
        shutil.rmtree(packed.folder, ignore_errors=True)

    async def parts() -> AsyncIterator[memoryview]:
        try:
            for at in range(0, len(packed), ARCHIVE_CHUNK):
                part = await run_in_threadpool(packed.read, at, ARCHIVE_CHUNK)
                if at + ARCHIVE_CHUNK >= len(packed):  # all read: gone before the last bytes go
                    await run_in_threadpool(cleanup)
                yield memoryview(part)
        except BaseException:  # a file unreadable midway: the answer ends early, and the
            # background task never runs; nor may this wait (a cancelled stream)
            asyncio.get_running_loop().run_in_executor(None, cleanup)
            raise

    return ClosingStream(
        parts(),
        media_type=protocol.TAR,
        headers={
            "Content-Length": str(len(packed)),
            "Content-Disposition": f'attachment; filename="{name}.tar"',
        },
        background=BackgroundTask(cleanup),
    )


TAR_REQUEST: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {protocol.TAR: {"schema": {"type": "string", "format": "binary"}}},
    }
}


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
    openapi_extra=TAR_REQUEST,
)
async def load(request: Request, name: TableName, core: CoreDep) -> dict[str, Any]:
    """Replace (or create) the table from an archive ``dump`` made of it (at most
    ``--max-body-bytes``; a larger one goes in parts: ``load/begin``). Answers its info."""
    require_media_type(request, protocol.TAR)
    body = await read_body(request, request.app.state.bodies, core.settings.max_body_bytes)
    return await core.load(name, body)


# ------------------------------------------------------------------ a load in parts
class UploadAnswer(BaseModel):
    upload: str = Field(description="The upload's id: name it in its parts and its commit.")
    size: int = Field(description="The archive's size, as begun.")
    received: int = Field(description="Bytes received so far, from the start.")
    part_bytes: int = Field(description="A part's size at most (the server's body limit).")
    timeout: float = Field(description="Seconds the upload may idle before it is dropped.")


def _upload(core: Any, upload: Any) -> dict[str, Any]:
    return {
        "upload": upload.id,
        "size": upload.size,
        "received": upload.received,
        "part_bytes": core.uploads.part_bytes,
        "timeout": core.uploads.idle,
    }


@declare(
    router,
    LOAD_BEGIN,
    response_model=UploadAnswer,
    responses=error_responses(PayloadTooLarge, InsufficientStorage),
)
async def load_begin(name: TableName, core: CoreDep, body: LoadBeginParams) -> dict[str, Any]:
    """Begin a load of an archive of ``size`` bytes (at most ``--max-load-bytes``) in parts:
    answers the upload's id and the part size; send the parts (``load/part``), then
    ``load/commit``. An upload idle over ``--load-timeout`` is dropped."""
    return _upload(core, await core.load_begin(name, body))


@declare(
    router,
    LOAD_PART,
    response_model=UploadAnswer,
    responses=error_responses(
        "CodecError", InsufficientStorage, PayloadTooLarge, UnsupportedMediaType
    ),
    openapi_extra=TAR_REQUEST,
)
async def load_part(
    request: Request, name: TableName, core: CoreDep, params: Annotated[LoadPartParams, Query()]
) -> dict[str, Any]:
    """The archive's bytes from ``offset`` (where those received end; a retry may repeat
    received bytes, the same ones), at most the part size. Answers the bytes received."""
    require_media_type(request, protocol.TAR)
    limit = core.settings.max_body_bytes

    async def read() -> memoryview:
        return await read_body(request, request.app.state.bodies, limit)

    return _upload(core, await core.load_part(name, params, read))


@declare(
    router,
    LOAD_COMMIT,
    responses=error_responses(
        "CodecError", InvalidCheckpoint, SchemaError, CheckpointError, BackendError
    ),
)
async def load_commit(name: TableName, core: CoreDep, body: LoadUpload) -> dict[str, Any]:
    """Replace (or create) the table from the whole upload, as ``load`` does; the upload
    ends either way (a failure leaves the table as it was). Answers its info."""
    return await core.load_commit(name, body)


class AbortAnswer(BaseModel):
    aborted: bool = Field(description="Whether the upload was under way.")


@declare(router, LOAD_ABORT, response_model=AbortAnswer, responses=error_responses(InvalidRequest))
async def load_abort(name: TableName, core: CoreDep, body: LoadUpload) -> dict[str, bool]:
    """Drop an upload and its staged bytes (answered alike if it ended already)."""
    return {"aborted": await core.load_abort(name, body)}
