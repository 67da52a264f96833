"""Schemathesis against the app's own OpenAPI document: no generated input gets a 5xx.

Every operation gets a few generated cases (examples of the schema first,
then random ones, derandomized so runs repeat), sent in process through
ASGI to an app with a table (``cartpole``, the path parameter's example)
and a client-creatable memory backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tdreplay.codec import protocol
from tdreplay.service import Settings, create_app

#: no 5xx, and every answer is one the document declares (status, media type, body schema)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
OPERATIONS = [
    (path, method)
    for path, ops in create_app(Settings(root=Path("unused"))).openapi()["paths"].items()
    for method in ops
]


@schemathesis.serializer(protocol.ARROW_STREAM, protocol.TAR)
def _arrow(ctx: Any, value: Any) -> bytes:
    """Arrow and tar bodies are opaque bytes to the fuzzer (``format: binary``)."""
    return bytes(value) if isinstance(value, bytes | bytearray) else str(value).encode()


@pytest.mark.parametrize(
    ("path", "method"), OPERATIONS, ids=[f"{m.upper()} {p}" for p, m in OPERATIONS]
)
def test_no_server_errors(service, tmp_path: Path, path: str, method: str) -> None:
    client = service(
        root=tmp_path / "data",
        schema_path="schemas/cartpole.yaml",
        backend="memory",
        allowed_backends=["memory"],
        max_table_bytes=64 << 20,
        max_body_bytes=1 << 20,
        max_load_bytes=8 << 20,  # a begin past it is a 413, not the disk's 507
        max_timeout=0.01,
        raise_server_exceptions=False,
    )
    operation = schemathesis.openapi.from_asgi("/openapi.json", client.app)[path][method]

    @given(case=operation.as_strategy())
    @settings(
        max_examples=30,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: Any) -> None:
        case.call_and_validate(checks=CHECKS)

    fuzz()
