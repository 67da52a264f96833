"""Data: extend, sample, stream, update_priority (the hot path).

extend and sample skip FastAPI's per-request machinery (routing and dependency
solving cost more than a small sample): :data:`HOT_ROUTES` names, for each, a
handler that reads its few parameters with the same models the endpoint
declares (:mod:`tdreplay.codec.operations`) and calls the endpoint itself,
so the OpenAPI document and what is enforced come from one declaration;
:class:`~tdreplay.service.hotpath.HotRoutes`, the one way past the framework,
serves them. The extend body is read into a reused buffer and
decoded zero-copy into flat columns (:mod:`tdreplay.service.bodies`); a sample
is gathered straight into a pooled Arrow IPC body (:mod:`tdreplay.service.wire`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import BaseModel, Field

from tdreplay.codec import CodecError, protocol
from tdreplay.codec.operations import (
    EXTEND,
    INSERT,
    READ,
    REMOVE,
    SAMPLE,
    STREAM,
    UPDATE_PRIORITY,
)
from tdreplay.codec.params import (
    ExtendParams,
    InsertParams,
    PriorityUpdate,
    ReadParams,
    RemoveParams,
    SampleParams,
    Seconds,
    StreamParams,
    parse,
)
from tdreplay.codec.request_ids import MAX_REQUEST_ID
from tdreplay.storage import (
    RateLimitTimeout,
    SchemaError,
    TableClosed,
    TableNotFound,
    TDReplayError,
)

from ..bodies import read_body
from ..core import Core
from ..deps import (
    ARROW_REQUEST,
    CoreDep,
    TableName,
    arrow_response,
    declare,
    error_responses,
    require_media_type,
)
from ..errors import PayloadTooLarge, UnsupportedMediaType
from ..streaming import ClosingStream, client_gone
from ..wire import EOS

log = logging.getLogger("tdreplay.service")
router = APIRouter(tags=["data"])

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class ExtendResult(BaseModel):
    index: list[int] = Field(
        description="The slot of each row sent, in order; -1 for a row a max_value table dropped."
    )
    rows: int = Field(description="How many rows were written.")


def _core(request: Request) -> Core:
    return request.app.state.core


#: a write's X-Request-Id header, as the contract's models declare it
RequestId = Annotated[
    str | None,
    Header(
        alias=protocol.REQUEST_ID,
        max_length=MAX_REQUEST_ID,
        description=ExtendParams.model_fields["request_id"].description,
    ),
]


# ------------------------------------------------------------------ extend
async def extend(
    request: Request,
    name: TableName,
    core: CoreDep,
    timeout: Annotated[Seconds, Query()] = None,
    request_id: RequestId = None,
) -> Response:
    """Insert the rows of an Arrow IPC record batch (exactly the table's keys, shapes and dtypes).

    Waits (asynchronously) up to ``timeout`` seconds while the rate limiter holds
    inserts back, then answers 429. A rejected body writes nothing.
    """
    params = parse(ExtendParams, {"timeout": timeout, protocol.REQUEST_ID: request_id})
    handle = core.table(name)  # 404 before the body is read; passed on: looked up once
    columns = await _rows(request, core)
    index, replayed = await core.extend(handle, columns, params)
    written = protocol.rows_written(index)
    content = json.dumps({"index": index.tolist(), "rows": written}).encode()
    headers = {protocol.ROWS_WRITTEN: str(written)}
    if replayed:
        headers[protocol.IDEMPOTENT_REPLAY] = "true"
    return Response(content, media_type=protocol.JSON, headers=headers)


#: what a write of Arrow rows (extend, insert) may answer besides its result
WRITE_ERRORS = error_responses(
    SchemaError,
    CodecError.__name__,
    TableNotFound,
    RateLimitTimeout,
    PayloadTooLarge,
    UnsupportedMediaType,
)


async def _rows(request: Request, core: Core) -> dict[Any, Any]:
    """The Arrow body's rows as flat columns (read into a reused buffer, decoded zero-copy)."""
    require_media_type(request, protocol.ARROW_STREAM)
    state = request.app.state
    body = await read_body(request, state.bodies, core.settings.max_body_bytes)
    return state.decoder.decode_columns(body)[0]


class InsertResult(BaseModel):
    index: dict[str, list[int]] = Field(
        description="The slot of each row in each table; -1 for a row a max_value table dropped."
    )
    rows: dict[str, int] = Field(
        description="How many rows went into each table (fewer than sent where a "
        "max-value writer dropped some)."
    )


async def insert(
    request: Request,
    core: CoreDep,
    into: Annotated[str, Query(description=InsertParams.model_fields["into"].description)],
    timeout: Annotated[Seconds, Query()] = None,
    request_id: RequestId = None,
) -> Response:
    """Insert the rows of an Arrow IPC record batch into several tables, each with its own
    initial priority (``into``: a JSON object, table -> priority or null).

    Every table is checked first: a missing one, or one refusing the rows, writes nothing
    anywhere. Each table's insert is then atomic, and idempotent by ``X-Request-Id``.
    """
    params = parse(
        InsertParams, {"into": into, "timeout": timeout, protocol.REQUEST_ID: request_id}
    )
    # the core looks the tables up, then reads the body: a missing table is a 404 first
    index, replayed = await core.insert(params, lambda: _rows(request, core))
    content = json.dumps(
        {
            "index": {k: v.tolist() for k, v in index.items()},
            "rows": {k: protocol.rows_written(v) for k, v in index.items()},
        }
    )
    headers = {protocol.IDEMPOTENT_REPLAY: "true"} if replayed else None
    return Response(content.encode(), media_type=protocol.JSON, headers=headers)


declare(
    router,
    INSERT,
    response_class=Response,
    responses={
        200: {"model": InsertResult, "description": "The slots written, by table."},
        **WRITE_ERRORS,
    },
    openapi_extra=ARROW_REQUEST,
)(insert)


async def _extend(request: Request) -> Response:
    q = request.query_params
    return await extend(
        request,
        request.path_params["name"],
        _core(request),
        q.get("timeout"),  # type: ignore[arg-type]  # parsed by ExtendParams
        request.headers.get(protocol.REQUEST_ID),
    )


# ------------------------------------------------------------------ sample
async def sample(
    name: TableName, params: Annotated[SampleParams, Query()], core: CoreDep, request: Request
) -> Response:
    """Sample ``batch_size`` items; waits up to ``timeout`` seconds for the rate limiter, then 429.
    A client that hangs up while its sample waits ends the wait: nothing is drawn for it."""
    lease = await core.sample(name, params, left=lambda: _hung_up(request))
    return Response(lease.body, media_type=protocol.ARROW_STREAM)


async def _hung_up(request: Request) -> None:
    """Return once the client's connection is gone, or its sending side ended."""
    await client_gone(request.scope, request.receive)


async def _sample(request: Request) -> Response:
    params = parse(SampleParams, request.query_params)
    return await sample(request.path_params["name"], params, _core(request), request)


# The hot routes first (matched in order).
declare(
    router,
    EXTEND,
    response_class=Response,
    responses={
        200: {"model": ExtendResult, "description": "The slots written."},
        **WRITE_ERRORS,
    },
    openapi_extra=ARROW_REQUEST,
)(extend)
declare(
    router,
    SAMPLE,
    response_class=Response,
    responses={
        **arrow_response(
            "An Arrow IPC stream of one record batch: the table's fields, `index`, "
            "`sample_info.priority`, `sample_info.weight`, `sample_info.times_sampled`, "
            "`sample_info.key`; a prioritized table's `sample_info.max_weight` (float64: what "
            "`weight` was divided by, `(N * P_min)^-beta`)."
        ),
        **error_responses(TableNotFound, RateLimitTimeout, PayloadTooLarge),
    },
)(sample)

#: the routes :class:`~tdreplay.service.hotpath.HotRoutes` serves without routing, by
#: name, and the handler that serves each (the framework serves the endpoint itself for
#: a request that comes another way)
HOT_ROUTES: dict[str, Handler] = {"extend": _extend, "sample": _sample}


class RemoveResult(BaseModel):
    removed: int = Field(description="How many items were removed (skipped slots aside).")


@declare(
    router,
    REMOVE,
    response_model=RemoveResult,
    responses=error_responses(TableNotFound),
)
async def remove(name: TableName, params: RemoveParams, core: CoreDep) -> RemoveResult:
    """Remove sampled items (Reverb's ``mutate_priorities(deletes=...)``).

    Slots whose item was removed since the sample are skipped; with ``key``, so are
    slots overwritten since (their item has another key). A bad index or key list
    changes nothing (400).
    """
    return RemoveResult(removed=await core.remove(name, params))


# ------------------------------------------------------------------ read
@declare(
    router,
    READ,
    response_class=Response,
    responses={
        **arrow_response(
            "An Arrow IPC stream of one record batch: the items' fields and `index` (no "
            "sample info: nothing is counted as sampled)."
        ),
        **error_responses(TableNotFound, PayloadTooLarge),
    },
)
async def read(name: TableName, params: ReadParams, core: CoreDep) -> Response:
    """The items in the given slots, as stored (a slot holding no item is a 400)."""
    return Response(await core.read(name, params), media_type=protocol.ARROW_STREAM)


# ------------------------------------------------------------------ stream
@declare(
    router,
    STREAM,
    response_class=ClosingStream,
    responses={
        **arrow_response("A chunked Arrow IPC stream: one record batch per sample, as /sample's."),
        **error_responses(TableNotFound, RateLimitTimeout, PayloadTooLarge),
    },
)
async def stream(
    name: TableName, params: Annotated[StreamParams, Query()], core: CoreDep, request: Request
) -> ClosingStream:
    """Keep sampled batches coming as one Arrow IPC stream, as fast as the client reads them.

    The first sample is drawn before the answer starts, so a table that cannot
    be sampled answers 429 (or 404) as /sample does. A later sample that times
    out, or the table's deletion, ends the stream early with a clean end of
    stream: the client sees fewer than ``count`` batches.
    """
    header, batches = await core.stream(name, params, left=lambda: _hung_up(request))

    async def body() -> AsyncIterator[bytes | memoryview]:
        yield header
        sent = 0
        try:
            async for batch in batches:
                sent += 1
                yield batch
        except (RateLimitTimeout, TableNotFound, TableClosed) as err:
            log.info("stream of table %r ends after %d chunks: %s", name, sent, err)
        except TDReplayError as err:  # pragma: no cover - defensive
            log.warning("stream of table %r ends after %d chunks: %s", name, sent, err)
        yield EOS

    return ClosingStream(body(), media_type=protocol.ARROW_STREAM)


# ------------------------------------------------------------------ priorities
class PriorityResult(BaseModel):
    updated: int = Field(description="How many priorities were applied (skipped slots aside).")


@declare(
    router,
    UPDATE_PRIORITY,
    response_model=PriorityResult,
    responses=error_responses(TableNotFound),
)
async def update_priority(name: TableName, update: PriorityUpdate, core: CoreDep) -> PriorityResult:
    """Set the priorities of sampled slots (prioritized tables).

    Slots whose item was removed since the sample are skipped; with ``key``,
    so are slots overwritten since (their item has another key). A request with
    lengths that differ changes nothing (400).
    """
    return PriorityResult(updated=await core.update_priority(name, update))
