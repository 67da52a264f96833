"""The ``>>>`` examples of ``tdreplay.torchrl``'s docstrings run."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tdreplay.torchrl

MODULES = ["tdreplay.torchrl"] + [
    m.name for m in pkgutil.walk_packages(tdreplay.torchrl.__path__, prefix="tdreplay.torchrl.")
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
