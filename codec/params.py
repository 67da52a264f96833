"""The parameters of the contract's operations, and the rules they follow, for both sides.

Each operation of :mod:`.operations` names its parameter model here; the
server validates a request with it and the client validates its arguments
with the same model before sending, so a bad argument is refused with the
same error on either side. A model's error becomes
:class:`~tdreplay.codec.errors.InvalidRequest` naming the field (:func:`parse`).
The limits (``MAX_*``) are the contract's, the same on both sides.

    >>> parse(SampleParams, {"batch_size": "32"}).batch_size
    32
    >>> parse(SampleParams, {"batch_size": "0"})
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.InvalidRequest: batch_size: Input should be greater than or equal to 1 (got '0')
    >>> parse(PriorityUpdate, {"index": [1, 2], "priority": [0.5]})
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.InvalidRequest: 2 indices but 1 priorities [field 'priority']
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sized
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Json,
    Strict,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from . import protocol
from .errors import InvalidRequest
from .indices import SlotIndex
from .minari_files import DATASET_ID_PATTERN
from .request_ids import MAX_REQUEST_ID, RequestId

#: largest batch a request may ask for (a table's capacity and the body limit bound it further)
MAX_BATCH = 1 << 31
#: longest client path (checkpoint, restore, export)
MAX_PATH = 1024
#: most slots one priority update may carry
MAX_UPDATE = 1 << 24
#: most slots one read may name (the body limit bounds the answer further)
MAX_READ = 1 << 20
#: most tables one insert may name
MAX_INSERT_TABLES = 16

#: the longest wait armed (about 31 years): a socket's, a lock's or a timer's timeout
#: overflows past about 9.2e9 seconds (``OverflowError``); a longer one waits this long
MAX_WAIT = 1e9

#: how long a call may wait for the rate limiter: seconds >= 0, ``inf`` for no limit of the
#: caller's (a server holds a call at most its ``--max-timeout``); NaN is refused. The one rule
#: of every door and of an in-process ``Table`` (where ``None`` is no limit too)
Seconds = Annotated[
    float | None,
    Field(
        ge=0,
        description="Seconds to wait for the rate limiter before answering 429; inf: no limit "
        "of the caller's (default: the server's default timeout; capped by its maximum).",
    ),
]


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):  # an int to Python: True would be a batch of 1
        raise PydanticCustomError("int_type", "a batch size is a number of items, not a boolean")
    return value


#: a batch size: an int, or its digits (an HTTP query's), never a bool (as a slot)
BatchSize = Annotated[  # the bounds before the validator: as bounds in the JSON Schema
    int, Field(ge=1, le=MAX_BATCH, description="Items per batch."), BeforeValidator(_not_a_bool)
]
#: how many batches: a stream's ``count``, a client loader's ``num_batches``
Count = Annotated[int, Field(ge=1)]
SampledKeys = Annotated[
    list[SlotIndex] | None,
    Field(
        max_length=MAX_UPDATE,
        description="The sampled items' keys (`sample_info.key`), one per slot: only slots "
        "still holding the item with that key are changed. Omitted: no check.",
    ),
]


class Params(BaseModel):
    model_config = ConfigDict(frozen=True)  # an unknown query parameter is ignored


class Body(Params):
    """The parameters of an operation that carries them as a JSON body: a field it does not
    know is refused (a misspelt ``"kye"`` would otherwise drop the key check of a remove)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ExtendParams(Params):
    model_config = ConfigDict(frozen=True, populate_by_name=True)

    timeout: Seconds = None
    request_id: RequestId = Field(
        default=None,
        alias="X-Request-Id",  # protocol.REQUEST_ID: a header over HTTP, errors name it so
        max_length=MAX_REQUEST_ID,
        description="Makes the extend idempotent: a repeat of a recent id is answered "
        "with the first answer and inserts nothing.",
    )


#: a priority as a number (strict: ``true`` or ``"1"`` is no priority, as for a slot)
PriorityValue = Annotated[float, Strict()]
Priority = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
#: a table's name as a parameter names it (as long as a route's ``{name}`` may be)
TableKey = Annotated[str, StringConstraints(min_length=1, max_length=protocol.MAX_TABLE_NAME)]


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
    request_id: RequestId = Field(
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
    count: Count | None = Field(
        default=None, description="Batches to send; omitted: until the client leaves."
    )
    timeout: Seconds = None


class BufferParams(Params):
    rows: int = Field(ge=1, le=MAX_BATCH, strict=True, description="Rows the buffers hold.")


class PriorityUpdate(Body):
    index: list[SlotIndex] = Field(
        max_length=MAX_UPDATE, description="Slots, as sampled (`index`)."
    )
    priority: list[PriorityValue] = Field(
        max_length=MAX_UPDATE, description="New priorities, one per slot (>= 0, finite)."
    )
    key: SampledKeys = None

    @model_validator(mode="after")
    def _one_per_slot(self) -> PriorityUpdate:
        check_lengths(self.index, priority=self.priority, key=self.key)
        return self


class RemoveParams(Body):
    index: list[SlotIndex] = Field(
        max_length=MAX_UPDATE, description="Slots of the items to remove, as sampled (`index`)."
    )
    key: SampledKeys = None

    @model_validator(mode="after")
    def _one_per_slot(self) -> RemoveParams:
        check_lengths(self.index, key=self.key)
        return self


class ReadParams(Body):
    index: list[SlotIndex] = Field(
        max_length=MAX_READ, description="Slots to read, each holding an item."
    )


class PathBody(Body):
    path: str | None = Field(
        default=None,
        max_length=MAX_PATH,
        description=f"A folder relative to the data root, inside {protocol.CHECKPOINTS}/; "
        f"default: {protocol.CHECKPOINTS}/{{name}}.",
    )


class ExportBody(Body):
    format: Literal["parquet", "csv", "minari"] | None = Field(
        default=None,
        description="Omitted: told from the path's suffix (.parquet, .pq, .csv; another is "
        "refused), Parquet when streamed back. A format the path's suffix contradicts "
        "(csv into run.parquet) is refused (tdreplay.codec.exports).",
    )
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


class LoadBeginParams(Body):
    size: int = Field(ge=1, lt=1 << 63, strict=True, description="The archive's size in bytes.")


class LoadPartParams(Params):
    upload: UploadId
    offset: int = Field(
        ge=0, lt=1 << 63, description="Where the part starts: the bytes received so far."
    )  # a retry may repeat bytes received already: they must be the same


class LoadUpload(Body):
    upload: UploadId  # commit and abort name only the upload


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


class _Timeout(Params):
    timeout: Seconds = None


def seconds(timeout: Any) -> float | None:
    """A call's ``timeout`` by the contract's rule (:data:`Seconds`), as the server checks
    it: for a client call before anything is sent, and for an in-process ``Table`` call.
    A huge or infinite one is valid (a server holds the call at most its maximum; a wait
    is armed for at most :func:`bounded` of it); remembered as :func:`sample_params`.

        >>> seconds(1e12), seconds(float("inf"))
        (1000000000000.0, inf)
        >>> seconds(float("nan"))
        Traceback (most recent call last):
        ...
        tdreplay.codec.errors.InvalidRequest: timeout: Input should be greater than or equal to 0 (got nan)

    Raises:
        InvalidRequest: negative, NaN or not a number; names ``timeout``.
    """
    try:
        return _remembered_seconds(timeout)
    except TypeError:  # unhashable: checked, not remembered
        return parse(_Timeout, {"timeout": timeout}).timeout


@functools.lru_cache(maxsize=64, typed=True)
def _remembered_seconds(timeout: Any) -> float | None:
    return parse(_Timeout, {"timeout": timeout}).timeout


def bounded(timeout: float) -> float:
    """``timeout``, at most :data:`MAX_WAIT`: what a socket, a lock or a timer can be armed
    for, which is as long as it takes.

    >>> bounded(30.0), bounded(float("inf")) == MAX_WAIT
    (30.0, True)
    """
    return min(timeout, MAX_WAIT)


def broken_rule(problems: list[Any]) -> InvalidRequest | None:
    """The contract's own error among a model's validation ``problems`` (pydantic's
    ``errors()``), as the rule raised it (e.g. :func:`check_lengths`); ``None`` if none."""
    for problem in problems:
        raised = (problem.get("ctx") or {}).get("error")
        if isinstance(raised, InvalidRequest):
            return raised
    return None
