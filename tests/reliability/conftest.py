"""Reliability tests: real ``tdreplay serve`` processes, killed, locked out and restarted.

They reuse ``live_server`` (tests/conftest.py) and the service tests' table and
rows (tests/service/service_helpers.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
