"""Schemathesis against a real ``tdreplay serve`` process with a token: no request gets a 5xx.

The server runs as it does in production (uvicorn, its own process, a bearer
token from ``TDREPLAY_TOKEN``) with the cartpole table; schemathesis reads
its ``/openapi.json`` and sends every operation a few generated requests,
the token on each, so they get past the guard to the handlers. The in-process
run of ``tests/service/test_fuzz.py`` checks more (status codes, media types
and bodies against the document) with more examples; this one checks what
reaches a real socket: ``not_a_server_error``.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tdreplay.codec import protocol
from tdreplay.service import Settings, create_app

TOKEN = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@schemathesis.serializer(protocol.ARROW_STREAM, protocol.TAR)
def _opaque(ctx: Any, value: Any) -> bytes:
    """Arrow and tar bodies are opaque bytes to the fuzzer (``format: binary``)."""
    return bytes(value) if isinstance(value, bytes | bytearray) else str(value).encode()


@pytest.fixture(scope="module")
def api_schema(live_server: Any) -> Any:
    server = live_server(
        "--schema",
        "schemas/cartpole.yaml",
        "--allowed-backends",
        "memory",
        backend="memory",
        max_table_bytes=64 << 20,
        max_body_bytes=1 << 20,
        max_load_bytes=8 << 20,  # a begin past it is a 413, not the disk's 507
        max_timeout=0.01,
        env={"TDREPLAY_TOKEN": TOKEN},
    )
    status, _, _ = server.request("GET", "/v1/tables")
    assert status == 401, "the server must require the token"
    status, _, _ = server.request("GET", "/v1/tables", headers=AUTH)
    assert status == 200
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=AUTH)


#: (path, method) of every operation the app documents, for one test each
OPERATIONS = [
    (path, method)
    for path, ops in create_app(Settings(root=Path("unused"))).openapi()["paths"].items()
    for method in ops
]


@pytest.mark.parametrize(
    ("path", "method"), OPERATIONS, ids=[f"{m.upper()} {p}" for p, m in OPERATIONS]
)
def test_no_server_errors_on_a_live_server(api_schema: Any, path: str, method: str) -> None:
    operation = api_schema[path][method]
    statuses: list[int] = []

    @given(case=operation.as_strategy())
    @settings(
        max_examples=12,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: Any) -> None:
        response = case.call_and_validate(headers=AUTH, checks=[not_a_server_error], timeout=30)
        statuses.append(response.status_code)

    fuzz()
    assert set(statuses) - {401}, "every request was turned away at the token check"
