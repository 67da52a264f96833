"""Client test fixtures: a real server per test module (``live_server`` comes from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture(scope="module")
def server(live_server: Callable[..., Any]) -> Any:
    """One ``tdreplay serve`` process shared by a test module (tables get unique names)."""
    return live_server()
