"""The ``>>>`` examples in the docstrings run, so they cannot drift from the code."""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import tempfile
from pathlib import Path

import pytest

PACKAGES = [
    "tdreplay.system",
    "tdreplay.codec",
    "tdreplay.storage",
    "tdreplay.service.core",
    "tdreplay.client",
    "tdreplay.cli",
]


def modules() -> list[str]:
    names = []
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        names.append(pkg_name)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg_name + "."):
            if not info.name.endswith("__main__"):
                names.append(info.name)
    return names


@pytest.mark.parametrize("name", modules())
def test_docstring_examples(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.chdir(repo)  # examples refer to schemas/ like a user in a checkout would
    # the examples' tempfile.mkdtemp() data roots go where the test's own files go, and
    # are deleted with them (they were left in the system's temp folder, one set a run)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    assert result.failed == 0, (
        f"{result.failed} of {result.attempted} docstring examples failed in {name}"
    )
