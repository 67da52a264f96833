"""Table specs for ``create_table``: a mapping, or a YAML/JSON schema file read here.

The client sends the spec as JSON and the server validates it (it owns the
:class:`TableSpec` model); the client only reads files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


def load_spec(spec: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """The spec as a JSON-ready dict.

    Raises:
        ValueError: the file cannot be read or is not a mapping.
    """
    if isinstance(spec, Mapping):
        return dict(spec)
    path = Path(spec)
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"{path}: cannot read schema: {err.strerror}") from None
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a table schema must be a mapping, got {type(data).__name__}")
    return data
