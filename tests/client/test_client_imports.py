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


def test_every_error_of_the_tree_is_a_public_name() -> None:
    """Each class the client's error tree draws (``tdreplay.client.errors``' docstring, the
    README's client **Errors**) is importable from ``tdreplay.client`` and is the same class
    as there; ``ShmUnavailable``, what ``transport="shm"`` raises, was only in
    ``tdreplay.client.shm``."""
    import re

    import tdreplay.client as c
    from tdreplay.client import errors, shm

    drawn = re.findall(r"[│├└─ ]+ ([A-Z]\w+)", errors.__doc__ or "")
    assert {"ReplayError", "ServerError", "TransportError", "ShmUnavailable"} <= set(drawn)
    for name in drawn:
        home = errors if hasattr(errors, name) else shm  # ShmUnavailable: the socket's own
        assert name in c.__all__ and getattr(c, name, None) is getattr(home, name), name
    assert issubclass(c.ShmUnavailable, c.ConnectionFailed)
