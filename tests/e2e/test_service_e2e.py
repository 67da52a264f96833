"""End to end: real ``tdreplay serve`` processes on free ports, spoken to over loopback."""

from __future__ import annotations


def test_ready_and_lists_tables(live_server) -> None:
    server = live_server("--schema", "schemas/cartpole.yaml", backend="memory")
    status, _, body = server.request("GET", "/v1/tables")
    assert status == 200
    assert b"cartpole" in body
