"""Declarative table schemas: the pydantic models behind ``schemas/*.yaml``.

A :class:`TableSpec` says everything a table is: its name and capacity, the
fields each item carries (nested keys written with dots, ``next.reward``), the
storage backend, the sampler, the writer, the rate limiter and the
checkpoint hooks. A schema file is just another way to call the constructor::

    >>> from tdreplay.storage import TableSpec
    >>> spec = TableSpec.model_validate({
    ...     "name": "tiny", "capacity": 8,
    ...     "fields": {"obs": {"shape": [4], "dtype": "float32"},
    ...                "next.reward": {"shape": [1], "dtype": "float32"}},
    ... })
    >>> spec.sampler.kind, spec.backend.kind
    ('uniform', 'memmap')
    >>> sorted(spec.keys())
    [('next', 'reward'), ('obs',)]

The specs of the parts (:class:`FieldSpec`, :data:`BackendSpec`,
:data:`SamplerSpec`, :data:`WriterSpec`, :class:`RateLimiterSpec`,
:class:`CheckpointSpec`) live in :mod:`~tdreplay.storage.component_specs` and
are importable from here too. Element types are those of
:mod:`tdreplay.codec.dtypes`, the one list of them.

The JSON Schema of the file format, ``schemas/table.schema.json``, is generated
from these models by ``python -m tdreplay.storage.spec``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from tdreplay.codec.schema_file import read_schema

from . import names
from .component_specs import (
    SELF_DURABLE_BACKENDS,
    BackendSpec,
    CheckpointSpec,
    FieldSpec,
    FifoSamplerSpec,
    H5BackendSpec,
    LifoSamplerSpec,
    MaxValueWriterSpec,
    MemmapBackendSpec,
    MemoryBackendSpec,
    PrioritizedSamplerSpec,
    RateLimiterSpec,
    RedisBackendSpec,
    RoundRobinWriterSpec,
    SamplerSpec,
    SharedBackendSpec,
    SliceSamplerSpec,
    SpecModel,
    UniformSamplerSpec,
    WithoutReplacementSamplerSpec,
    WriterSpec,
)
from .errors import SchemaError

__all__ = [
    "SELF_DURABLE_BACKENDS",
    "RESERVED_KEYS",
    "BackendSpec",
    "CheckpointSpec",
    "FieldSpec",
    "FifoSamplerSpec",
    "H5BackendSpec",
    "LifoSamplerSpec",
    "MaxValueWriterSpec",
    "MemmapBackendSpec",
    "MemoryBackendSpec",
    "NestedKey",
    "PrioritizedSamplerSpec",
    "RateLimiterSpec",
    "RedisBackendSpec",
    "RoundRobinWriterSpec",
    "SamplerSpec",
    "SharedBackendSpec",
    "SliceSamplerSpec",
    "SpecModel",
    "TableSpec",
    "UniformSamplerSpec",
    "WithoutReplacementSamplerSpec",
    "WriterSpec",
    "join_key",
    "json_schema",
    "main",
    "split_key",
]


#: keys a sampled batch adds next to the schema's fields (see ``Table.sample``).
RESERVED_KEYS = ("index", "sample_info")


NestedKey = tuple[str, ...]


def _identity(spec: TableSpec) -> dict[str, Any]:
    data = spec.model_dump(mode="json")
    data["backend"].pop("preallocate", None)
    return data


def _difference(a: Any, b: Any, where: str) -> tuple[str, Any, Any] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            found = _difference(a.get(key), b.get(key), f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
        return None
    return (where or "spec", a, b) if a != b else None


def split_key(name: str) -> NestedKey:
    """``"next.reward"`` -> ``("next", "reward")``."""
    return tuple(name.split("."))


def join_key(key: str | tuple[str, ...]) -> str:
    """``("next", "reward")`` -> ``"next.reward"``; a string passes through."""
    return key if isinstance(key, str) else ".".join(key)


class _FieldError(ValueError):
    """A schema problem located at ``where`` (a dotted path), for checks that span several fields."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where


class TableSpec(SpecModel):
    """A replay table, declared.

    Raises:
        SchemaError: (from :meth:`from_file` / :meth:`parse`) when the schema is
            malformed; the message names the file, the field and the problem.
    """

    name: str = Field(pattern=names.TABLE_PATTERN)
    capacity: int = Field(ge=1, le=1 << 40)
    fields: dict[str, FieldSpec] = Field(min_length=1, description="Nested keys written with dots.")
    backend: BackendSpec = Field(default_factory=MemmapBackendSpec)
    sampler: SamplerSpec = Field(default_factory=UniformSamplerSpec)
    writer: WriterSpec = Field(default_factory=RoundRobinWriterSpec)
    max_times_sampled: int = Field(
        default=0, ge=0, description="Remove an item after this many samples; 0: never."
    )
    rate_limiter: RateLimiterSpec = Field(default_factory=RateLimiterSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    description: str | None = None

    @field_validator("fields")
    @classmethod
    def _check_fields(cls, fields: dict[str, FieldSpec]) -> dict[str, FieldSpec]:
        keys = set()
        folded: dict[str, str] = {}
        for name in fields:
            parts = split_key(name)
            for part in parts:
                try:
                    names.check_field_segment(part)
                except ValueError as err:
                    raise _FieldError(f"fields.{name}", f"field name {name!r}: {err}") from None
            other = folded.setdefault(name.lower(), name)
            if other != name:  # one file on a case-insensitive file system
                raise _FieldError(
                    f"fields.{name}",
                    f"field names {other!r} and {name!r} differ only in case",
                )
            if parts[0] in RESERVED_KEYS:
                raise _FieldError(
                    f"fields.{name}", f"field name {name!r} is reserved for sample info"
                )
            keys.add(parts)
        for key in keys:  # "next" and "next.reward" cannot both be leaves
            for i in range(1, len(key)):
                if key[:i] in keys:
                    raise _FieldError(
                        f"fields.{join_key(key)}",
                        f"field {join_key(key)!r} is nested under field {join_key(key[:i])!r}",
                    )
        return fields

    @model_validator(mode="after")
    def _check_parts(self) -> TableSpec:
        if self.rate_limiter.min_size_to_sample > self.capacity:
            raise _FieldError(
                "rate_limiter.min_size_to_sample",
                f"rate_limiter.min_size_to_sample {self.rate_limiter.min_size_to_sample} exceeds "
                f"capacity {self.capacity}: the table could never be sampled",
            )
        if isinstance(self.writer, MaxValueWriterSpec):
            self._scalar_field(self.writer.key, "writer.key")
            if isinstance(self.sampler, FifoSamplerSpec | LifoSamplerSpec | SliceSamplerSpec):
                raise _FieldError(
                    "writer", f"sampler {self.sampler.kind!r} needs the round_robin writer"
                )
        if isinstance(self.sampler, SliceSamplerSpec):
            s = self.sampler
            if s.slice_len > self.capacity:
                raise _FieldError(
                    "sampler.slice_len",
                    f"sampler.slice_len {s.slice_len} exceeds capacity {self.capacity}",
                )
            if s.traj_key is None and s.end_key is None:
                raise _FieldError("sampler", "slice sampler needs traj_key or end_key")
            if s.traj_key is not None:
                self._scalar_field(s.traj_key, "sampler.traj_key")
            else:
                self._scalar_field(s.end_key or "", "sampler.end_key")
        if isinstance(
            self.sampler, FifoSamplerSpec | LifoSamplerSpec
        ) and self.max_times_sampled not in (
            0,
            1,
        ):
            raise _FieldError(
                "max_times_sampled",
                "fifo/lifo samplers return each item once; max_times_sampled must be 0 or 1",
            )
        return self

    def _scalar_field(self, name: str, where: str) -> None:
        if name not in self.fields:
            raise _FieldError(where, f"{where} {name!r} is not a field of the table")
        if self.fields[name].numel != 1:
            raise _FieldError(
                where,
                f"{where} {name!r} must hold one value per item, has shape {self.fields[name].shape}",
            )

    # ---------------------------------------------------------------- views
    def keys(self) -> list[NestedKey]:
        """The nested keys of the fields, in schema order."""
        return [split_key(n) for n in self.fields]

    def torch_schema(self) -> dict[NestedKey, tuple[list[int], torch.dtype]]:
        """The ``{key: (shape, dtype)}`` mapping ``TensorDict.from_schema`` takes."""
        return {split_key(n): (list(f.shape), f.torch_dtype) for n, f in self.fields.items()}

    def categories(self) -> dict[NestedKey, int]:
        """The integer fields that declare ``n`` categories: ``{key: n}``."""
        return {split_key(k): f.n for k, f in self.fields.items() if f.n is not None}

    @functools.cached_property
    def item_nbytes(self) -> int:
        """Bytes one item takes in storage (computed once: the hot path asks often)."""
        return sum(f.nbytes for f in self.fields.values())

    def difference(self, other: TableSpec) -> tuple[str, Any, Any] | None:
        """The first place where ``other`` declares another table than this one: its
        dotted path, this spec's value there and ``other``'s (``None``: the same table).
        How its disk is reserved (``backend.preallocate``) is no difference: it changes
        no row, no answer.

            >>> a = TableSpec.model_validate({"name": "t", "capacity": 8,
            ...     "fields": {"x": {"shape": [], "dtype": "int64"}}})
            >>> a.difference(a.model_copy(update={"capacity": 16}))
            ('capacity', 8, 16)
        """
        return _difference(_identity(self), _identity(other), "")

    # ---------------------------------------------------------------- files
    @classmethod
    def parse(cls, data: Any, *, source: str = "<schema>") -> TableSpec:
        """Validate a decoded schema (a dict), naming ``source`` in any error."""
        try:
            return cls.model_validate(data)
        except ValidationError as err:

            def where(e: Any) -> str:
                cause = (e.get("ctx") or {}).get("error")
                if isinstance(cause, _FieldError):  # a cross-field check knows its field
                    return cause.where
                return ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-after"))

            loc = where(err.errors()[0])
            problems = "; ".join(f"{where(e) or '<root>'}: {e['msg']}" for e in err.errors())
            raise SchemaError(
                f"{source}: invalid table schema: {problems}", field=loc or None
            ) from None

    @classmethod
    def from_file(cls, path: str | Path) -> TableSpec:
        """Load a schema from a YAML (``.yaml``/``.yml``) or JSON (``.json``) file.

        Raises:
            SchemaError: the file is missing, unparsable or invalid; the message
                names the file, the field and the problem.

        Example:
            >>> spec = TableSpec.from_file("schemas/cartpole.yaml")  # doctest: +SKIP
        """
        return cls.parse(read_schema(path), source=str(path))

    @classmethod
    def from_dir(cls, path: str | Path) -> list[TableSpec]:
        """Every ``*.yaml``/``*.yml``/``*.json`` schema in a folder (the JSON Schema itself excluded)."""
        path = Path(path)
        files = sorted(
            p
            for p in path.iterdir()
            if p.suffix in (".yaml", ".yml", ".json") and not p.name.endswith(".schema.json")
        )
        return [cls.from_file(p) for p in files]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the table schema format."""
    schema = TableSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://tdreplay.dev/schemas/table.schema.json"
    return schema


def main() -> None:  # python -m tdreplay.storage.spec [out]
    import sys

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("schemas/table.schema.json")
    out.write_text(json.dumps(json_schema(), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
