"""Reliability tests: real ``tdreplay serve`` processes, killed, locked out and restarted.

They reuse ``live_server`` (tests/conftest.py) and the service tests' table and
rows (tests/service/service_helpers.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))

from reliability_helpers import RedisProcess


@pytest.fixture
def redis_proc(tmp_path: Path) -> Iterator[RedisProcess]:
    """A ``redis-server`` of the test's own, stopped after it."""
    r = RedisProcess(tmp_path)
    r.start()
    yield r
    r.stop()
