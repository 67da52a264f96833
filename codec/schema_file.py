"""Reading a table schema file: the one reader of the server, the client and the command.

A schema file is YAML (``.yaml``, ``.yml``), or JSON by its ``.json`` suffix, holding one
mapping; what the mapping must say is the server's to check
(:class:`tdreplay.storage.TableSpec`). A file that does not parse is one line naming the
file, the line and the column, and the problem, not the parser's message over several
lines with a caret under the offending one:

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "bad.yaml"
    >>> _ = path.write_text("name: t\\n  capacity: 8\\n")
    >>> read_schema(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.SchemaError: .../bad.yaml: not valid YAML at line 2, column 11: mapping values are not allowed here
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from .errors import SchemaError


def read_schema(path: str | Path) -> dict[str, Any]:
    """The mapping the schema file at ``path`` holds.

    Raises:
        SchemaError: the file cannot be read, is not UTF-8 text, does not parse (the
            message names the file, the line and the column), or holds no mapping.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SchemaError(f"{path}: cannot read schema: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise SchemaError(f"{path}: not UTF-8 text (byte {err.start})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise SchemaError(
            f"{path}: not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}"
        ) from None
    except yaml.YAMLError as err:
        raise SchemaError(f"{path}: {_yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise SchemaError(f"{path}: a table schema must be a mapping, got {type(data).__name__}")
    return data


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's error as one line: where, what, and what it was parsing (and from where)."""
    if not isinstance(err, yaml.MarkedYAMLError):
        return "not valid YAML: " + " ".join(str(err).split())
    mark = err.problem_mark or err.context_mark
    where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
    problem = " ".join((err.problem or err.context or "cannot be parsed").split())
    said = f"not valid YAML{where}: {problem}"
    if err.problem and err.context:
        began = err.context_mark
        at = "" if began is None else f" from line {began.line + 1}, column {began.column + 1}"
        said += f" ({' '.join(err.context.split())}{at})"
    return said
