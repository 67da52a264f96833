"""The operations of the contract, each defined once for both sides: the server's
doors decode into them, the client's plans encode them.

An :class:`Operation` names one call - its HTTP method and route, the model of
its parameters, how they travel, whether a repeat is harmless, whether the
same-host socket carries it - and :data:`OPERATIONS` lists them all. The
server declares its routes from it (a test checks that the OpenAPI document
and the client's requests match it) and validates with its models; the client
builds its requests from it and validates with the same models before
sending, so a bad argument is refused with the same error on either side.
A model's error becomes :class:`~tdreplay.codec.errors.InvalidRequest` naming
the field (:func:`parse`).

    >>> parse(SampleParams, {"batch_size": "32"}).batch_size
    32
    >>> parse(SampleParams, {"batch_size": "0"})
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.InvalidRequest: batch_size: Input should be greater than or equal to 1 (got '0')
    >>> SAMPLE.method, SAMPLE.path("cartpole")
    ('POST', '/v1/tables/cartpole/sample')
    >>> parse(PriorityUpdate, {"index": [1, 2], "priority": [0.5]})
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.InvalidRequest: 2 indices but 1 priorities [field 'priority']
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sized
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Json,
    StringConstraints,
    ValidationError,
    model_validator,
)

from . import protocol
from .errors import InvalidRequest
from .minari_files import DATASET_ID_PATTERN

#: largest batch a request may ask for (a table's capacity and the body limit bound it further)
MAX_BATCH = 1 << 31
#: longest X-Request-Id
MAX_REQUEST_ID = 200
#: longest client path (checkpoint, restore, export)
MAX_PATH = 1024
#: most slots one priority update may carry
MAX_UPDATE = 1 << 24
#: most slots one read may name (the body limit bounds the answer further)
MAX_READ = 1 << 20
#: most tables one insert may name
MAX_INSERT_TABLES = 16

Seconds = Annotated[
    float | None,
    Field(
        ge=0,
        allow_inf_nan=False,
        description="Seconds to wait for the rate limiter before answering 429 "
        "(default: the server's default timeout; capped by its maximum).",
    ),
]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH, description="Items per batch.")]
SlotIndex = Annotated[int, Field(ge=0, lt=1 << 63)]
SampledKeys = Annotated[
    list[SlotIndex] | None,
    Field(
        max_length=MAX_UPDATE,
        description="The sampled items' keys (`sample_info.key`), one per slot: only slots "
        "still holding the item with that key are changed. Omitted: no check.",
    ),
]


class Params(BaseModel):
    model_config = ConfigDict(
        frozen=True
    )  # unknown fields are ignored, as query strings and bodies always were


class ExtendParams(Params):
    model_config = ConfigDict(frozen=True, populate_by_name=True)

    timeout: Seconds = None
    request_id: str | None = Field(
        default=None,
        alias="X-Request-Id",  # protocol.REQUEST_ID: a header over HTTP, errors name it so
        max_length=MAX_REQUEST_ID,
        description="Makes the extend idempotent: a repeat of a recent id is answered "
        "with the first answer and inserts nothing.",
    )


Priority = Annotated[float, Field(ge=0, allow_inf_nan=False)]
#: a table's name as a parameter names it (as long as a route's ``{name}`` may be)
TableKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class InsertParams(Params):
    """One insert of the same rows into several tables, each with its own initial priority."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    into: Json[dict[TableKey, Priority | None]] = Field(
        description="The tables, as a JSON object: table name -> the new items' initial "
        "priority there (prioritized tables; null: the sampler's default). Each table's "
        "insert is atomic; a table missing or refusing the rows stops them all before any "
        "is written."
    )
    timeout: Seconds = None
    request_id: str | None = Field(
        default=None,
        alias="X-Request-Id",
        max_length=MAX_REQUEST_ID,
        description="Makes the insert idempotent, table by table: a repeat of a recent id "
        "inserts nothing where the first call did, and the rest where it did not.",
    )

    @model_validator(mode="after")
    def _some_tables(self) -> InsertParams:
        if not 1 <= len(self.into) <= MAX_INSERT_TABLES:
            raise InvalidRequest(
                f"an insert names 1 to {MAX_INSERT_TABLES} tables, got {len(self.into)}",
                field="into",
                expected=f"1..{MAX_INSERT_TABLES}",
                got=len(self.into),
            )
        return self


class SampleParams(Params):
    batch_size: BatchSize
    timeout: Seconds = None


class StreamParams(Params):
    batch_size: BatchSize
    count: int | None = Field(
        default=None, ge=1, description="Batches to send; omitted: until the client leaves."
    )
    timeout: Seconds = None


class BufferParams(Params):
    rows: int = Field(ge=1, le=MAX_BATCH, strict=True, description="Rows the buffers hold.")


class PriorityUpdate(Params):
    index: list[SlotIndex] = Field(
        max_length=MAX_UPDATE, description="Slots, as sampled (`index`)."
    )
    priority: list[float] = Field(
        max_length=MAX_UPDATE, description="New priorities, one per slot (>= 0, finite)."
    )
    key: SampledKeys = None

    @model_validator(mode="after")
    def _one_per_slot(self) -> PriorityUpdate:
        check_lengths(self.index, priority=self.priority, key=self.key)
        return self


class RemoveParams(Params):
    index: list[SlotIndex] = Field(
        max_length=MAX_UPDATE, description="Slots of the items to remove, as sampled (`index`)."
    )
    key: SampledKeys = None

    @model_validator(mode="after")
    def _one_per_slot(self) -> RemoveParams:
        check_lengths(self.index, key=self.key)
        return self


class ReadParams(Params):
    index: list[SlotIndex] = Field(
        max_length=MAX_READ, description="Slots to read, each holding an item."
    )


class PathBody(Params):
    path: str | None = Field(
        default=None,
        max_length=MAX_PATH,
        description=f"A folder relative to the data root, inside {protocol.CHECKPOINTS}/; "
        f"default: {protocol.CHECKPOINTS}/{{name}}.",
    )


class ExportBody(Params):
    format: Literal["parquet", "csv", "minari"] = "parquet"
    path: str | None = Field(
        default=None,
        max_length=MAX_PATH,
        description="A new file relative to the data root, inside exports/, to write "
        "(409 if it exists); omitted: the file is streamed back. Minari: the datasets "
        "root (a folder inside exports/, made if new) the dataset goes under.",
    )
    dataset_id: str | None = Field(
        default=None,
        max_length=MAX_PATH,
        pattern=DATASET_ID_PATTERN,
        description="Minari: the dataset's id, namespace/name-v0 (409 if it exists).",
    )
    env_spec: str | None = Field(
        default=None,
        max_length=1 << 16,
        description="Minari: the environment's spec for the metadata, as gymnasium's EnvSpec JSON.",
    )


#: a load's upload, as the server named it at ``load_begin`` (the client only repeats it)
UploadId = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9a-f]{32}$"),
    Field(description="The upload, as load_begin named it."),
]


class LoadBegin(Params):
    size: int = Field(ge=1, lt=1 << 63, strict=True, description="The archive's size in bytes.")


class LoadPart(Params):
    upload: UploadId
    offset: int = Field(
        ge=0, lt=1 << 63, description="Where the part starts: the bytes received so far."
    )  # a retry may repeat bytes received already: they must be the same


class LoadUpload(Params):
    upload: UploadId  # commit and abort name only the upload


# ------------------------------------------------------------------ the operations
#: how an operation's parameters travel over HTTP: the query string, a JSON body, an
#: Arrow IPC body (the rows; the parameters in the query and headers), a tar archive, none
Carrier = Literal["query", "json", "arrow", "tar", "none"]


@dataclass(frozen=True, eq=False)  # each operation is one object: compared and hashed by identity
class Operation:
    """One call of the contract.

    Attributes:
        name: its name: the server's route name, the same-host socket's ``op``, the
            metrics' label.
        method: its HTTP method.
        route: its HTTP path, ``{name}`` standing for the table.
        params: the model its parameters are validated with on both sides (``None``:
            it takes none, or a table schema).
        carrier: how its parameters travel over HTTP.
        idempotent: whether sending it twice is harmless (a client may retry it after
            the request may have reached the server). An extend is, by its request id.
        same_host: whether the same-host socket carries it (the client's shared-memory
            channel; the rest go over HTTP).
    """

    name: str
    method: Literal["GET", "POST", "DELETE"]
    route: str
    params: type[Params] | None = None
    carrier: Carrier = "none"
    idempotent: bool = True
    same_host: bool = False

    def path(self, table: str = "") -> str:
        """The route with the table's name in it (quote it first: it is put in as given)."""
        return self.route.replace("{name}", table)


def _on_table(
    name: str, method: Literal["GET", "POST", "DELETE"], action: str = "", **kw: Any
) -> Operation:
    return Operation(name, method, protocol.table_path("{name}", action), **kw)


#: liveness (never needs the token)
HEALTHZ = Operation("healthz", "GET", "/healthz")
LIST_TABLES = Operation("list_tables", "GET", protocol.TABLES)
#: creating twice fails (409), unless ``if_absent``: then the client may retry it
CREATE_TABLE = Operation("create_table", "POST", protocol.TABLES, carrier="json", idempotent=False)
SERVER_INFO = Operation("server_info", "GET", f"{protocol.API}/info")
#: the status page's data: every table's figures and their recent history
STATUS = Operation("status", "GET", f"{protocol.API}/status")
#: the same rows into several tables (Reverb's insert with priorities per table)
INSERT = Operation("insert", "POST", f"{protocol.API}/insert", params=InsertParams, carrier="arrow")
INFO = _on_table("info", "GET", same_host=True)
DELETE_TABLE = _on_table("delete_table", "DELETE")
CLEAR = _on_table("clear", "POST", "clear", same_host=True)
EXTEND = _on_table("extend", "POST", "extend", params=ExtendParams, carrier="arrow", same_host=True)
SAMPLE = _on_table("sample", "POST", "sample", params=SampleParams, carrier="query", same_host=True)
STREAM = _on_table("stream", "GET", "stream", params=StreamParams, carrier="query")
UPDATE_PRIORITY = _on_table(
    "update_priority", "POST", "update_priority", params=PriorityUpdate, carrier="json",
    same_host=True,
)  # fmt: skip
REMOVE = _on_table("remove", "POST", "remove", params=RemoveParams, carrier="json")
READ = _on_table("read", "POST", "read", params=ReadParams, carrier="json")
CHECKPOINT = _on_table("checkpoint", "POST", "checkpoint", params=PathBody, carrier="json")
RESTORE = _on_table("restore", "POST", "restore", params=PathBody, carrier="json")
EXPORT = _on_table("export", "POST", "export", params=ExportBody, carrier="json")
DUMP = _on_table("dump", "POST", "dump")
LOAD = _on_table("load", "POST", "load", carrier="tar")
#: a load in parts (an archive over the body limit): begin (names the upload and the part
#: size; a repeat would stage another), parts in order, commit (restores it) or abort
LOAD_BEGIN = _on_table(
    "load_begin", "POST", "load/begin", params=LoadBegin, carrier="json", idempotent=False
)  # fmt: skip
LOAD_PART = _on_table("load_part", "POST", "load/part", params=LoadPart, carrier="tar")
LOAD_COMMIT = _on_table(
    "load_commit", "POST", "load/commit", params=LoadUpload, carrier="json", idempotent=False
)  # fmt: skip
LOAD_ABORT = _on_table("load_abort", "POST", "load/abort", params=LoadUpload, carrier="json")

#: every operation, by name
OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        HEALTHZ, LIST_TABLES, CREATE_TABLE, SERVER_INFO, STATUS, INSERT, INFO, DELETE_TABLE, CLEAR, EXTEND, SAMPLE,
        STREAM, UPDATE_PRIORITY, REMOVE, READ, CHECKPOINT, RESTORE, EXPORT, DUMP, LOAD,
        LOAD_BEGIN, LOAD_PART, LOAD_COMMIT, LOAD_ABORT,
    )
}  # fmt: skip


def check_lengths(
    index: Sized,
    *,
    priority: Sized | None = None,
    key: Sized | None = None,
    table: str | None = None,
) -> None:
    """The one rule of calls on sampled slots: a priority and a key per slot, when given.

    Raises:
        InvalidRequest: a length differs from the slots'; names the field.
    """
    slots = len(index)
    for name, values in (("priority", priority), ("key", key)):
        n = None if values is None else len(values)
        if n is not None and n != slots:
            what = "priorities" if name == "priority" else "keys"
            raise InvalidRequest(
                ("" if table is None else f"table {table!r}: ") + f"{slots} indices but {n} {what}",
                table=table,
                field=name,
                expected=slots,
                got=n,
            )


P = TypeVar("P", bound=BaseModel)


def parse(model: type[P], values: Mapping[str, Any]) -> P:
    """``values`` validated by ``model``.

    Raises:
        InvalidRequest: a value breaks a rule, a required one is missing, or an
            unknown one is given; names the first such field.
    """
    try:
        return model.model_validate(dict(values))
    except ValidationError as err:
        problems = err.errors()
        ruled = broken_rule(problems)
        if ruled is not None:
            raise ruled from None
        first = problems[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        got = first.get("input")
        shown = repr(got)[:60] if first["type"] != "missing" else "nothing"
        raise InvalidRequest(
            f"{where}: {first['msg']} (got {shown})",
            field=where,
            got=got if isinstance(got, int | float | str) else None,
        ) from None


def sample_params(batch_size: Any, timeout: Any) -> SampleParams:
    """:func:`parse` of a sample's values (a binary frame's, or a client call's before
    anything is sent), remembered: a learner asks for the same size again and again, and
    the model is frozen. Values that cannot be remembered (unhashable) are only checked.

        >>> sample_params(32, None).batch_size
        32

    Raises:
        InvalidRequest: as :func:`parse` (a refusal is not remembered).
    """
    try:
        return _remembered_sample_params(batch_size, timeout)
    except TypeError:  # unhashable (a list, say): checked, not remembered
        return parse(SampleParams, {"batch_size": batch_size, "timeout": timeout})


@functools.lru_cache(maxsize=256, typed=True)
def _remembered_sample_params(batch_size: Any, timeout: Any) -> SampleParams:
    return parse(SampleParams, {"batch_size": batch_size, "timeout": timeout})


def broken_rule(problems: list[Any]) -> InvalidRequest | None:
    """The contract's own error among a model's validation ``problems`` (pydantic's
    ``errors()``), as the rule raised it (e.g. :func:`check_lengths`); ``None`` if none."""
    for problem in problems:
        raised = (problem.get("ctx") or {}).get("error")
        if isinstance(raised, InvalidRequest):
            return raised
    return None
