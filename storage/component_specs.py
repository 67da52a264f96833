"""The specs of a table's parts: its fields, backend, sampler, writer, rate limiter, checkpoint hooks.

Each is a small frozen pydantic model named ``*Spec``, so that it never shares
a name with the part it declares (:class:`SliceSamplerSpec` declares a
:class:`~tdreplay.storage.samplers.SliceSampler`, :class:`H5BackendSpec` an
:class:`~tdreplay.storage.backends.H5Backend`). The parts a table has one of
several kinds of are discriminated unions on ``kind``: :data:`BackendSpec`,
:data:`SamplerSpec`, :data:`WriterSpec`. :class:`~tdreplay.storage.TableSpec`
puts them together.

    >>> SliceSamplerSpec(slice_len=8).end_key
    'next.done'
    >>> FieldSpec(shape=[2, 3], dtype="bfloat16").nbytes
    12
    >>> FieldSpec(shape=[], dtype="int64", n=4).model_dump()  # a Minari export: Discrete(4)
    {'shape': [], 'dtype': 'int64', 'n': 4}
    >>> FieldSpec(shape=[2], dtype="float32").model_dump()
    {'shape': [2], 'dtype': 'float32'}
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from tdreplay.codec.dtypes import TORCH, DTypeName

from . import names


class SpecModel(BaseModel):
    """Base of every spec: unknown keys are refused, and a spec never changes once made."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class FieldSpec(SpecModel):
    """One field of an item: its per-item shape and dtype; for a categorical integer
    field, the number of values its elements take (``n``). A field without ``n``
    serializes without it."""

    shape: list[Annotated[int, Field(ge=1, le=1 << 31)]] = Field(
        default_factory=list,
        max_length=8,
        description="Per-item shape; [] for a scalar. Every dimension is at least 1.",
    )
    dtype: DTypeName = Field(description="Element type.")
    n: int | None = Field(
        default=None,
        ge=1,
        description="An integer field's number of categories: its elements take the values "
        "0 .. n-1 (TorchRL's Categorical; a Minari export's Discrete or MultiDiscrete space). "
        "An extend holding another value is refused, naming the field; nothing is written.",
    )

    @model_validator(mode="after")
    def _check_n(self) -> FieldSpec:
        if self.n is None:
            return self
        if self.dtype == "bool" or TORCH[self.dtype].is_floating_point:
            raise ValueError(f"n (categories) is for integer fields; this one is {self.dtype}")
        top = int(torch.iinfo(TORCH[self.dtype]).max)
        if self.n - 1 > top:
            raise ValueError(f"n = {self.n} categories do not fit {self.dtype} (at most {top + 1})")
        return self

    @model_serializer(mode="wrap")
    def _without_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a field that declares no categories reads, and is stored, as before they existed
        data: dict[str, Any] = handler(self)
        if data.get("n", 0) is None:
            del data["n"]
        return data

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH[self.dtype]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.torch_dtype.itemsize


# ------------------------------------------------------------------ backends
#: backends whose tables reopen from their own files with every acknowledged row (see
#: :mod:`tdreplay.storage.durable`): a checkpoint only copies them
SELF_DURABLE_BACKENDS = frozenset({"memmap"})


class MemoryBackendSpec(SpecModel):
    """Plain in-process tensors (lost when the process exits; checkpoint to keep them)."""

    kind: Literal["memory"] = "memory"


class SharedBackendSpec(SpecModel):
    """CPU shared-memory tensors (in ``/dev/shm``): other processes on the host can attach."""

    kind: Literal["shared"] = "shared"
    preallocate: bool = Field(
        default=False,
        description="Reserve shared memory (/dev/shm) for the whole capacity when the table is "
        "created (a /dev/shm that cannot hold it fails the create) instead of in extents as "
        "rows arrive, as for memmap.",
    )


class MemmapBackendSpec(SpecModel):
    """Memory-mapped files on disk (the default), in the table's folder ``<root>/tables/<table>/``.

    Where data lives is the operator's choice (the data root), never the
    schema's: a schema cannot name a path.
    """

    kind: Literal["memmap"] = "memmap"
    preallocate: bool = Field(
        default=False,
        description="Reserve disk for the whole capacity when the table is created (a full "
        "disk fails the create) instead of in extents as rows arrive (a full disk fails the "
        "extend that needs more, with 507); the server's --preallocate does it for every "
        "memmap and h5 table.",
    )


class H5BackendSpec(SpecModel):
    """One HDF5 file in the table's folder, ``<root>/tables/<table>/storage.h5``."""

    kind: Literal["h5"] = "h5"
    preallocate: bool = Field(
        default=False,
        description="Reserve disk for the whole capacity when the table is created, as for "
        "memmap (default: in extents as rows arrive).",
    )


class RedisBackendSpec(SpecModel):
    """tensordict's ``TensorDictStore`` on a Redis (or Dragonfly) server.

    The server is not named here: ``connection`` names one the operator
    configured (``tdreplay serve --redis NAME=URL``, or ``redis={NAME: URL}``
    in :meth:`Table.create <tdreplay.storage.Table.create>`), so a schema
    cannot make the process connect anywhere else.
    """

    kind: Literal["redis"] = "redis"
    connection: str = Field(
        default="default",
        pattern=names.CONNECTION_PATTERN,
        description="Name of an operator-configured Redis connection.",
    )
    prefix: str | None = Field(
        default=None,
        pattern=names.PREFIX_PATTERN,
        description="Key namespace; defaults to 'tdreplay:<table>'.",
    )
    preallocate: bool = Field(
        default=False,
        description="Size every field's Redis string to the whole capacity when the table is "
        "created (Redis memory held from the start; a Redis without room fails the create) "
        "instead of growing it as rows arrive (a Redis out of memory fails the extend that "
        "needs more, with 507); the server's --preallocate does it for every redis table.",
    )


BackendSpec = Annotated[
    MemoryBackendSpec | SharedBackendSpec | MemmapBackendSpec | H5BackendSpec | RedisBackendSpec,
    Field(discriminator="kind"),
]


# ------------------------------------------------------------------ samplers
class UniformSamplerSpec(SpecModel):
    """Every stored item equally likely, with replacement."""

    kind: Literal["uniform"] = "uniform"


class PrioritizedSamplerSpec(SpecModel):
    """Proportional prioritized replay (Schaul et al.): P(i) ~ p_i^alpha, weights (N P(i))^-beta."""

    kind: Literal["prioritized"] = "prioritized"
    alpha: float = Field(default=0.6, ge=0)
    beta: float = Field(default=0.4, ge=0)
    eps: float = Field(default=1e-6, gt=0, description="Added to every priority so none is zero.")
    initial_priority: float | None = Field(
        default=None, gt=0, description="Priority of new items; default: the largest seen so far."
    )


class FifoSamplerSpec(SpecModel):
    """A queue: each item is returned once, oldest first; inserts wait while it is full."""

    kind: Literal["fifo"] = "fifo"


class LifoSamplerSpec(SpecModel):
    """A stack: each item is returned once, newest first; inserts wait while it is full."""

    kind: Literal["lifo"] = "lifo"


class WithoutReplacementSamplerSpec(SpecModel):
    """Epochs: every item once, in random order, before any repeats."""

    kind: Literal["without_replacement"] = "without_replacement"


class SliceSamplerSpec(SpecModel):
    """Sequences of ``slice_len`` consecutive items that never cross an episode boundary.

    Episodes are told apart by ``traj_key`` (an integer trajectory id per item,
    e.g. ``collector.traj_ids``) or, when that is not given, by ``end_key`` (a
    done flag that closes an episode, e.g. ``next.done``).
    """

    kind: Literal["slice"] = "slice"
    slice_len: int = Field(ge=1)
    traj_key: str | None = None
    end_key: str | None = "next.done"


SamplerSpec = Annotated[
    UniformSamplerSpec
    | PrioritizedSamplerSpec
    | FifoSamplerSpec
    | LifoSamplerSpec
    | WithoutReplacementSamplerSpec
    | SliceSamplerSpec,
    Field(discriminator="kind"),
]


# ------------------------------------------------------------------- writers
class RoundRobinWriterSpec(SpecModel):
    """Writes slots in ring order; when full the oldest item is overwritten."""

    kind: Literal["round_robin"] = "round_robin"


class MaxValueWriterSpec(SpecModel):
    """Keeps the ``capacity`` items with the largest ``key`` (a scalar per item); others are dropped."""

    kind: Literal["max_value"] = "max_value"
    key: str


WriterSpec = Annotated[RoundRobinWriterSpec | MaxValueWriterSpec, Field(discriminator="kind")]


# ---------------------------------------------------------- limiter, hooks
class RateLimiterSpec(SpecModel):
    """Reverb's rate limiter.

    Sampling waits until the table holds ``min_size_to_sample`` items. With
    ``samples_per_insert`` set, the ratio of sampled to inserted items is kept
    within ``error_buffer`` of it: inserts wait when they run too far ahead of
    samples, samples wait when they run too far ahead of inserts.
    """

    min_size_to_sample: int = Field(default=1, ge=1)
    samples_per_insert: float | None = Field(default=None, gt=0)
    error_buffer: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check_buffer(self) -> RateLimiterSpec:
        spi, buffer = self.samples_per_insert, self.error_buffer
        if spi is not None and buffer is None:
            raise ValueError("samples_per_insert needs error_buffer (Reverb's SampleToInsertRatio)")
        if spi is not None and buffer is not None and buffer < max(1.0, spi):
            # narrower, one insert can push the difference past the top while one sample
            # would push it past the bottom: both sides wait for good
            raise ValueError(
                f"error_buffer {buffer:g} is below max(1, samples_per_insert {spi:g}): inserts "
                "and samples could both wait for good (Reverb's SampleToInsertRatio refuses it too)"
            )
        return self


class CheckpointSpec(SpecModel):
    """Checkpoint hooks: TorchRL's ``TED2Flat`` on save and ``Flat2TED`` on load (a
    checkpoint whose rows the flat layout would change is written plainly instead)."""

    ted2flat: bool = False
