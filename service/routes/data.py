"""Data: extend, sample, stream, update_priority (the hot path).

extend and sample skip FastAPI's body handling: the request body is read
into a reused buffer and decoded zero-copy (:mod:`tdreplay.service.bodies`);
a sample is gathered straight into a pooled Arrow IPC body that goes to the
socket as a ``memoryview`` (:mod:`tdreplay.service.wire`). Their Arrow bodies
are declared for OpenAPI by hand.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from tdreplay.codec import CodecError, protocol
from tdreplay.storage import (
    InvalidRequest,
    RateLimitTimeout,
    SchemaError,
    TableClosed,
    TableNotFound,
    TDReplayError,
)

from ..bodies import read_body
from ..deps import (
    ARROW_REQUEST,
    BatchSize,
    SettingsDep,
    TableDep,
    TableName,
    Timeout,
    arrow_response,
    error_responses,
    require_media_type,
    resolve_timeout,
)
from ..errors import PayloadTooLarge, UnsupportedMediaType
from ..settings import Settings
from ..wire import EOS

log = logging.getLogger("tdreplay.service")
router = APIRouter(prefix=protocol.TABLES, tags=["data"])


class ExtendResult(BaseModel):
    index: list[int] = Field(description="The slots written, in the order of the rows sent.")
    rows: int = Field(description="How many rows were written.")


def lean(handler: Callable[[Request], Coroutine[Any, Any, Response]]) -> type[APIRoute]:
    """A route class documented from its endpoint's signature but served by ``handler``.

    FastAPI's per-request dependency solving and validation cost more than a
    small sample itself; the two hot routes parse their few parameters by hand
    (same names, bounds and errors as declared) and keep the OpenAPI operation
    their declared endpoint gives.
    """

    class LeanRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            return handler

    return LeanRoute


def lean_post(
    handler: Callable[[Request], Coroutine[Any, Any, Response]], path: str, **kwargs: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a POST route whose OpenAPI operation comes from the decorated endpoint, served by ``handler``."""

    def register(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        router.add_api_route(
            path, endpoint, methods=["POST"], route_class_override=lean(handler), **kwargs
        )
        return endpoint

    return register


def _int(request: Request, name: str, *, ge: int = 0) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        raise InvalidRequest(f"query parameter {name!r} is required", field=name)
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(
            f"query parameter {name!r} must be an integer, got {raw[:40]!r}",
            field=name,
            got=raw[:40],
        ) from None
    if value < ge:
        raise InvalidRequest(
            f"query parameter {name!r} must be >= {ge}, got {value}", field=name, got=value
        )
    return value


def _timeout(request: Request, settings: Settings) -> float:
    raw = request.query_params.get("timeout")
    if raw is None:
        return resolve_timeout(settings, None)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0:  # NaN too
        raise InvalidRequest(
            f"query parameter 'timeout' must be a number of seconds >= 0, got {raw[:40]!r}",
            field="timeout",
            got=raw[:40],
        )
    return resolve_timeout(settings, value)


async def _extend(request: Request) -> Response:
    state = request.app.state
    settings: Settings = state.settings
    handle = state.registry.get(request.path_params["name"])
    wait = _timeout(request, settings)
    require_media_type(request, protocol.ARROW_STREAM)
    request_id = request.headers.get(protocol.REQUEST_ID)
    if request_id is not None and len(request_id) > MAX_REQUEST_ID:
        raise InvalidRequest(
            f"{protocol.REQUEST_ID} longer than {MAX_REQUEST_ID} characters",
            field=protocol.REQUEST_ID,
        )

    async def insert() -> tuple[int, bytes]:
        body = await read_body(request, state.bodies, settings.max_body_bytes)
        index = await handle.extend(state.decoder.decode(body), wait)
        # the answer as sent: what the X-Request-Id memory keeps (8-ish bytes a row, not 36)
        return len(index), json.dumps({"index": index.tolist(), "rows": len(index)}).encode()

    (rows, content), replayed = await handle.recent.run(request_id, insert)
    headers = {protocol.ROWS_WRITTEN: str(rows)}
    if replayed:
        headers[protocol.IDEMPOTENT_REPLAY] = "true"
    return Response(content, media_type=protocol.JSON, headers=headers)


MAX_REQUEST_ID = 200


@lean_post(
    _extend,
    "/{name}/extend",
    name="extend",
    response_model=ExtendResult,
    openapi_extra=ARROW_REQUEST,
    responses=error_responses(
        SchemaError,
        CodecError.__name__,
        TableNotFound,
        RateLimitTimeout,
        PayloadTooLarge,
        UnsupportedMediaType,
    ),
)
async def extend(
    name: TableName,
    timeout: Timeout = None,
    request_id: Annotated[
        str | None,
        Header(
            alias=protocol.REQUEST_ID,
            max_length=MAX_REQUEST_ID,
            description="Makes the extend idempotent: a repeat of a recent id is answered "
            "with the first answer and inserts nothing.",
        ),
    ] = None,
) -> ExtendResult:
    """Insert the rows of an Arrow IPC record batch (exactly the table's keys, shapes and dtypes).

    Waits (asynchronously) up to ``timeout`` seconds while the rate limiter holds
    inserts back, then answers 429. A rejected body writes nothing.
    """
    raise NotImplementedError  # the declaration; `_extend` serves it


async def _sample(request: Request) -> Response:
    state = request.app.state
    handle = state.registry.get(request.path_params["name"])
    n = _int(request, "batch_size", ge=1)
    lease = await handle.sample(n, _timeout(request, state.settings))
    return Response(lease.body, media_type=protocol.ARROW_STREAM)


@lean_post(
    _sample,
    "/{name}/sample",
    name="sample",
    response_class=Response,
    responses={
        **arrow_response(
            "An Arrow IPC stream of one record batch: the table's fields, `index`, "
            "`sample_info.priority`, `sample_info.weight`, `sample_info.times_sampled`, "
            "`sample_info.key`."
        ),
        **error_responses(TableNotFound, RateLimitTimeout, PayloadTooLarge),
    },
)
async def sample(name: TableName, batch_size: BatchSize, timeout: Timeout = None) -> Response:
    """Sample ``batch_size`` items; waits up to ``timeout`` seconds for the rate limiter, then 429."""
    raise NotImplementedError  # the declaration; `_sample` serves it


@router.get(
    "/{name}/stream",
    name="stream",
    response_class=StreamingResponse,
    responses={
        **arrow_response("A chunked Arrow IPC stream: one record batch per sample, as /sample's."),
        **error_responses(TableNotFound, RateLimitTimeout, PayloadTooLarge),
    },
)
async def stream(
    handle: TableDep,
    settings: SettingsDep,
    batch_size: BatchSize,
    count: Annotated[
        int | None, Query(ge=1, description="Batches to send; omitted: until the client leaves.")
    ] = None,
    timeout: Timeout = None,
) -> StreamingResponse:
    """Keep sampled batches coming as one Arrow IPC stream, as fast as the client reads them.

    The first sample is drawn before the answer starts, so a table that cannot
    be sampled answers 429 (or 404) as /sample does. A later sample that times
    out, or the table's deletion, ends the stream early with a clean end of
    stream: the client sees fewer than ``count`` batches.
    """
    wait = resolve_timeout(settings, timeout)
    handle.check_batch_size(batch_size)
    layout = await run_in_threadpool(handle.samples.layout, batch_size)
    per_run = max(1, settings.stream_chunk_bytes // layout.batch_len)
    if not handle.runs_are_exact:
        per_run = 1

    async def draw(left: int | None) -> tuple[memoryview, int]:
        k = per_run if left is None else min(per_run, left)
        if k == 1:
            return (await handle.sample(batch_size, wait)).batch, 1
        run = await handle.sample_run(batch_size, k, wait)
        return run, len(run) // layout.batch_len

    first, sent = await draw(count)

    async def body() -> AsyncIterator[bytes | memoryview]:
        nonlocal sent
        yield layout.header
        yield first
        try:
            while count is None or sent < count:
                chunk, k = await draw(None if count is None else count - sent)
                sent += k
                yield chunk
        except (RateLimitTimeout, TableNotFound, TableClosed) as err:
            log.info("stream of table %r ends after %d batches: %s", handle.name, sent, err)
        except TDReplayError as err:  # pragma: no cover - defensive
            log.warning("stream of table %r ends after %d batches: %s", handle.name, sent, err)
        yield EOS

    return StreamingResponse(body(), media_type=protocol.ARROW_STREAM)


class PriorityUpdate(BaseModel):
    index: list[Annotated[int, Field(ge=0, lt=1 << 63)]] = Field(
        description="Slots, as sampled (`index`)."
    )
    priority: list[float] = Field(description="New priorities, one per slot (>= 0, finite).")
    key: list[Annotated[int, Field(ge=0, lt=1 << 63)]] | None = Field(
        default=None,
        description="The sampled items' keys (`sample_info.key`), one per slot: only slots "
        "still holding the item with that key are updated. Omitted: no check.",
    )


class PriorityResult(BaseModel):
    updated: int = Field(description="How many priorities were applied (skipped slots aside).")


@router.post(
    "/{name}/update_priority",
    name="update_priority",
    response_model=PriorityResult,
    responses=error_responses(TableNotFound),
)
async def update_priority(handle: TableDep, update: PriorityUpdate) -> PriorityResult:
    """Set the priorities of sampled slots (prioritized tables).

    Slots whose item was removed since the sample are skipped; with ``key``,
    so are slots overwritten since (their item has another key). A request with
    lengths that differ changes nothing (400).
    """
    if len(update.index) != len(update.priority):
        raise InvalidRequest(
            f"{len(update.index)} indices but {len(update.priority)} priorities",
            table=handle.name,
            field="priority",
            expected=len(update.index),
            got=len(update.priority),
        )
    with handle.use() as table:
        updated = await handle.call(
            lambda: table.update_priority(update.index, update.priority, key=update.key)
        )
    return PriorityResult(updated=updated)
