"""Table specs for ``create_table``: a mapping, a ``TableSpec`` (any pydantic model of the
spec), or a YAML/JSON schema file read here.

The client sends the spec as JSON and the server validates it (it owns the
:class:`TableSpec` model); the client only reads files, with the reader the server
and the command use (:mod:`tdreplay.codec.schema_file`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..codec.schema_file import read_schema

#: what ``create_table`` takes as a spec
SpecLike = Mapping[str, Any] | BaseModel | str | Path


def load_spec(spec: SpecLike) -> dict[str, Any]:
    """The spec as a JSON-ready dict.

        >>> load_spec({"name": "t", "capacity": 8, "fields": {}})["capacity"]
        8

    Raises:
        SchemaError: the file cannot be read, does not parse or is not a mapping
            (:func:`~tdreplay.codec.schema_file.read_schema`, as the server reads one).
        TypeError: ``spec`` is none of a mapping, a pydantic model, a path.
    """
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, BaseModel):  # a TableSpec made in code: the server validates it again
        return spec.model_dump(mode="json")
    if not isinstance(spec, str | Path):
        raise TypeError(
            f"a table spec is a mapping, a TableSpec or a schema file's path, not {type(spec).__name__}"
        )
    return read_schema(spec)
