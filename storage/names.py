"""The names callers give - tables, fields, Redis connections, key prefixes: one rule each.

A name ends up as a folder or file name, a Redis key, a key of JSON objects
in every client (a browser's included) and text on the ``/status`` page, so
each rule admits ASCII letters, digits, ``_`` and ``-`` only (``:`` and
``.`` too in a Redis prefix) and is matched against the *whole* name: with
``re.match`` and ``$``, ``"obs\\n"`` passed (``$`` also matches before a final
newline) and became a file the table could not reopen. The pydantic models use
the anchored ``*_PATTERN`` forms (matched whole by their regex engine, and by
any JSON Schema validator).

    >>> check_field_segment("obs")
    'obs'
    >>> check_field_segment("obs\\n")
    Traceback (most recent call last):
    ...
    ValueError: name segment 'obs\\n' must match [A-Za-z_][A-Za-z0-9_\\-]{0,127} (whole)
"""

from __future__ import annotations

import re

from tdreplay.codec.protocol import MAX_TABLE_NAME as TABLE_MAX

#: a table's name (a folder, a Redis key prefix, a metrics label, a URL segment)
TABLE = rf"[A-Za-z0-9_][A-Za-z0-9_\-]{{0,{TABLE_MAX - 1}}}"
#: one segment of a field's nested key (a file name, with ``.memmap`` after it)
FIELD_SEGMENT = r"[A-Za-z_][A-Za-z0-9_\-]{0,127}"
#: an operator's Redis connection
CONNECTION = TABLE
#: a Redis key namespace
PREFIX = r"[A-Za-z0-9_][A-Za-z0-9_:\-.]{0,127}"

TABLE_PATTERN = rf"^{TABLE}$"
CONNECTION_PATTERN = rf"^{CONNECTION}$"
PREFIX_PATTERN = rf"^{PREFIX}$"

_FIELD_SEGMENT = re.compile(FIELD_SEGMENT, re.ASCII)
_CONNECTION = re.compile(CONNECTION, re.ASCII)


def _check(kind: str, rule: re.Pattern[str], name: object) -> str:
    if not isinstance(name, str) or rule.fullmatch(name) is None:
        raise ValueError(f"{kind} {name!r} must match {rule.pattern} (whole)")
    return name


def check_field_segment(name: object) -> str:
    """``name`` if it is a valid segment of a field's key.

    Raises:
        ValueError: it is not.
    """
    return _check("name segment", _FIELD_SEGMENT, name)


def check_connection(name: object) -> str:
    """``name`` if it is a valid Redis connection name.

    Raises:
        ValueError: it is not.
    """
    return _check("redis connection name", _CONNECTION, name)
