"""The parameters of the table operations: each rule once, for every door.

Every door - the HTTP routes, the same-host socket, the CLI - validates what
a caller sends with these models, and the HTTP routes declare them, so the
OpenAPI document promises exactly what is enforced (a test compares the two).
A model's error becomes :class:`~tdreplay.storage.InvalidRequest` naming the
field (:func:`parse`).

    >>> parse(SampleParams, {"batch_size": "32"}).batch_size
    32
    >>> parse(SampleParams, {"batch_size": "0"})
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.InvalidRequest: batch_size: Input should be greater than or equal to 1 (got '0')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tdreplay.codec import protocol
from tdreplay.codec.minari_files import DATASET_ID_PATTERN
from tdreplay.storage import InvalidRequest

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


class RemoveParams(Params):
    index: list[SlotIndex] = Field(
        max_length=MAX_UPDATE, description="Slots of the items to remove, as sampled (`index`)."
    )
    key: SampledKeys = None


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
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        got = first.get("input")
        shown = repr(got)[:60] if first["type"] != "missing" else "nothing"
        raise InvalidRequest(
            f"{where}: {first['msg']} (got {shown})",
            field=where,
            got=got if isinstance(got, int | float | str) else None,
        ) from None
