"""Table specs for ``create_table``: a mapping, or a YAML/JSON schema file read here.

The client sends the spec as JSON and the server validates it (it owns the
:class:`TableSpec` model); the client only reads files, with the reader the server
and the command use (:mod:`tdreplay.codec.schema_file`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..codec.schema_file import read_schema


def load_spec(spec: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """The spec as a JSON-ready dict.

    Raises:
        SchemaError: the file cannot be read, does not parse or is not a mapping
            (:func:`~tdreplay.codec.schema_file.read_schema`, as the server reads one).
    """
    if isinstance(spec, Mapping):
        return dict(spec)
    return read_schema(spec)
