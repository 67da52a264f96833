"""The client stands alone: importing it pulls in neither the service nor the storage."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("tdreplay.service", "tdreplay.storage", "fastapi", "uvicorn", "starlette")


def test_client_imports_no_service_or_storage() -> None:
    code = (
        "import sys, tdreplay.client\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({FORBIDDEN!r}))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_public_names() -> None:
    import tdreplay.client as c

    for name in ("ReplayClient", "AsyncReplayClient", "RetryPolicy", "Loader", "Writer"):
        assert hasattr(c, name)
    for method in (
        "extend",
        "sample",
        "tensorclass",
        "loader",
        "update_priority",
        "writer",
        "info",
        "checkpoint",
        "export",
    ):
        assert callable(getattr(c.ReplayClient, method))
        assert callable(getattr(c.AsyncReplayClient, method))
