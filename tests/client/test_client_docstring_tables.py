"""The client's docstring examples that need a server (skipped by test_doctests) ask of the
shipped tables they name only what those tables do: an ``update_priority`` example names a
table whose shipped schema is prioritized (``cartpole``'s is uniform: the call is refused)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

from tdreplay.codec.schema_file import read_schema

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
#: the table an ``update_priority`` call names (a comment may sit between, as a directive)
CALL = re.compile(r"update_priority\((?:\s|#[^\n]*)*[\"'](\w+)[\"']")


def examples() -> list[tuple[str, str]]:
    """``(where, source)`` of every ``>>>`` example in tdreplay.client's docstrings."""
    import tdreplay.client as pkg

    found = []
    names = [pkg.__name__] + [
        m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=pkg.__name__ + ".")
    ]
    for name in names:
        for test in doctest.DocTestFinder().find(importlib.import_module(name)):
            found += [(test.name, ex.source) for ex in test.examples]
    return found


def test_priority_examples_name_a_prioritized_table() -> None:
    named = [(where, table) for where, source in examples() for table in CALL.findall(source)]
    assert named, "no update_priority example found: the pattern is out of date"
    wrong = [
        (where, table)
        for where, table in named
        if read_schema(SCHEMAS / f"{table}.yaml").get("sampler", {}).get("kind") != "prioritized"
    ]
    assert not wrong, f"update_priority examples on tables that keep no priorities: {wrong}"
