"""Tables: list, create from a schema, info, delete."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel

from tdreplay.codec import protocol
from tdreplay.storage import TableSpec
from tdreplay.storage.errors import (
    BackendError,
    SchemaError,
    TableExists,
    TableNotFound,
)
from tdreplay.storage.spec import H5Backend, MemmapBackend

from ..deps import RegistryDep, SettingsDep, TableDep, TableName, error_responses
from ..errors import Forbidden
from ..registry import Registry
from ..security import check_clear_of, confine
from ..settings import Settings

router = APIRouter(prefix=protocol.TABLES, tags=["tables"])


class TableList(BaseModel):
    tables: list[dict[str, Any]]


def admit(spec: TableSpec, settings: Settings, registry: Registry) -> TableSpec:
    """Check a client's schema against the server's policy; confine a storage path to the data root.

    Raises:
        Forbidden: the backend is not one clients may create tables on.
        SchemaError: the table would exceed ``max_table_bytes``.
        InvalidRequest: the storage path leaves the data root or overlaps live storage.
    """
    kind = spec.backend.kind
    if kind not in settings.allowed_backends:
        raise Forbidden(
            f"this server does not create {kind!r} tables for clients "
            f"(allowed: {', '.join(settings.allowed_backends)})",
            table=spec.name,
            field="backend.kind",
            expected=settings.allowed_backends,
            got=kind,
        )
    nbytes = spec.capacity * spec.item_nbytes
    if nbytes > settings.max_table_bytes:
        raise SchemaError(
            f"table {spec.name!r}: capacity {spec.capacity} x {spec.item_nbytes} bytes per item "
            f"exceeds the server's limit of {settings.max_table_bytes} bytes",
            table=spec.name,
            field="capacity",
            expected=f"<= {settings.max_table_bytes} bytes",
            got=nbytes,
        )
    backend = spec.backend
    if isinstance(backend, MemmapBackend | H5Backend) and backend.path is not None:
        target = confine(registry.root, backend.path, field="backend.path")
        check_clear_of(target, registry.storage_paths(), given=backend.path, field="backend.path")
        backend = backend.model_copy(update={"path": str(target)})
        spec = spec.model_copy(update={"backend": backend})
    return spec


@router.get("", name="list_tables", response_model=TableList, responses=error_responses())
async def list_tables(registry: RegistryDep) -> dict[str, Any]:
    """Every table, with its info."""
    infos = []
    for handle in registry.handles():
        try:
            infos.append(await handle.info())
        except TableNotFound:  # deleted meanwhile
            continue
    return {"tables": infos}


@router.post(
    "",
    name="create_table",
    status_code=201,
    responses=error_responses(SchemaError, TableExists, Forbidden, BackendError),
)
async def create_table(
    spec: TableSpec, registry: RegistryDep, settings: SettingsDep
) -> dict[str, Any]:
    """Create a table from a schema (the JSON form of a schema file). Answers its info."""
    spec = admit(spec, settings, registry)
    handle = await registry.create(spec)
    return await handle.info()


@router.get("/{name}", name="info", responses=error_responses(TableNotFound))
async def info(handle: TableDep) -> dict[str, Any]:
    """Size, capacity, backend, sampler, writer, counters, rate-limiter state, waiting calls."""
    return await handle.info()


@router.delete(
    "/{name}",
    name="delete_table",
    status_code=204,
    response_class=Response,
    responses=error_responses(TableNotFound),
)
async def delete_table(name: TableName, registry: RegistryDep) -> Response:
    """Delete a table and its data (calls waiting on it fail with 404)."""
    await registry.delete(name)
    return Response(status_code=204)
