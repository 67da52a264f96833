"""Tables: list, create from a schema, info, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel

from tdreplay.codec.operations import CLEAR, CREATE_TABLE, DELETE_TABLE, INFO, LIST_TABLES
from tdreplay.storage import (
    BackendError,
    InsufficientStorage,
    SchemaError,
    TableExists,
    TableNotFound,
    TableSpec,
)

from ..deps import CoreDep, TableName, declare, error_responses
from ..errors import Forbidden

router = APIRouter(tags=["tables"])


class TableList(BaseModel):
    tables: list[dict[str, Any]]
    unavailable: dict[str, str] = {}


@declare(router, LIST_TABLES, response_model=TableList, responses=error_responses())
async def list_tables(core: CoreDep) -> dict[str, Any]:
    """Every table, with its info; ``unavailable``: tables found on start but not served
    (damaged state, changed schema; their data is kept), and why."""
    return await core.tables()


@declare(
    router,
    CREATE_TABLE,
    status_code=201,
    responses=error_responses(
        SchemaError, TableExists, Forbidden, InsufficientStorage, BackendError
    ),
)
async def create_table(
    spec: TableSpec,
    core: CoreDep,
    replace: Annotated[
        bool,
        Query(
            description="Delete data an earlier table of this name left in its own folder "
            "(without it: 409). Folders tdreplay did not create are never touched."
        ),
    ] = False,
    if_absent: Annotated[
        bool,
        Query(
            description="Create-if-absent, one operation: a table of that name and this spec "
            "(one being created meanwhile included) is answered as if created; another spec "
            "is 409 naming the first difference. Concurrent creators with one spec all succeed."
        ),
    ] = False,
) -> dict[str, Any]:
    """Create a table from a schema (the JSON form of a schema file). Answers its info.

    The table's data goes to the server's own area, ``<root>/tables/<name>/``;
    a schema cannot name a path, and a Redis table names one of the server's
    configured connections (``backend.connection``).
    """
    return await core.create(spec, replace=replace, if_absent=if_absent)


@declare(router, INFO, responses=error_responses(TableNotFound))
async def info(name: TableName, core: CoreDep) -> dict[str, Any]:
    """Size, capacity, backend, sampler, writer, counters, rate-limiter state, waiting calls."""
    return await core.info(name)


@declare(
    router,
    DELETE_TABLE,
    status_code=204,
    response_class=Response,
    responses=error_responses(TableNotFound, BackendError),
)
async def delete_table(name: TableName, core: CoreDep) -> Response:
    """Delete a table and its data (calls waiting on it fail with 404); a redis table's Redis
    must answer (503 ``BackendError`` otherwise: the table is kept, delete it again later)."""
    await core.delete(name)
    return Response(status_code=204)


@declare(
    router,
    CLEAR,
    responses=error_responses(TableNotFound, "InsufficientStorage", "BackendError"),
)
async def clear(name: TableName, core: CoreDep) -> dict[str, Any]:
    """Empty the table, atomically and durably: a fresh table of its schema replaces it
    (sampler, rate limiter and counters start anew; calls waiting on it fail with 409, a
    crash leaves it empty or whole). Answers its info."""
    return await core.clear(name)
