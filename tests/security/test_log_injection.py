"""What a client sends never forges a line of the server's log.

The server logs each checkpoint, restore and export with the path the client
chose. A path holding a newline (or an escape sequence) wrote a line of the
client's own making into the log (``CRITICAL ...: FORGED``, in red on a
terminal) and left a file of that name in the data root; such a path is now
refused (400) before anything is written.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest

from tdreplay.codec import protocol
from tdreplay.codec.errors import BackendError

JSON = {"Content-Type": protocol.JSON}
FORGED = "\nCRITICAL tdreplay.service: FORGED \x1b[31mline\x1b[0m"
SCHEMA = {
    "name": "t",
    "capacity": 8,
    "fields": {"x": {"shape": [], "dtype": "int64"}},
    "backend": {"kind": "memory"},
}


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    server = live_server("--log-level", "info")
    status, _, raw = server.request("POST", protocol.TABLES, json.dumps(SCHEMA).encode(), JSON)
    assert status == 201, raw
    return server


def files_under(root: Any) -> set[str]:
    return {os.path.join(d, n) for d, dirs, names in os.walk(root) for n in dirs + names}


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("checkpoint", {"path": f"checkpoints/a{FORGED}/t"}),
        ("restore", {"path": f"checkpoints/a{FORGED}/t"}),
        ("export", {"path": f"exports/b{FORGED}.parquet", "format": "parquet"}),
        ("checkpoint", {"path": "checkpoints/tab\there/t"}),
        ("export", {"path": "exports/c\u202eteuqrap.csv", "format": "csv"}),
    ],
)
def test_a_path_with_control_characters_is_refused_and_logs_nothing_forged(
    server: Any, action: str, body: dict[str, Any]
) -> None:
    before = files_under(server.root)
    status, _, raw = server.request(
        "POST", protocol.table_path("t", action), json.dumps(body).encode(), JSON
    )
    assert status == 400, raw
    err = json.loads(raw)
    assert (status, err["type"], err["field"]) == (400, "InvalidRequest", "path"), err
    assert "control character" in err["detail"], err
    assert files_under(server.root) == before
    log = server.output()
    assert "FORGED" not in log and "\x1b" not in log and "\u202e" not in log, log[-2000:]
    # the same request with a printable path works, and its log line is one line
    fine = {**body, "path": body["path"].replace(FORGED, "-forged")}
    fine["path"] = fine["path"].replace("\t", "-").replace("\u202e", "-")
    if action != "restore":
        status, _, raw = server.request(
            "POST", protocol.table_path("t", action), json.dumps(fine).encode(), JSON
        )
        assert status == 200, raw


def test_the_path_of_a_failed_request_is_logged_escaped(service: Any, caplog: Any) -> None:
    """A request that fails with a 5xx is logged with its path: each control or format
    character of it escaped (a route that takes any path stands in for one that fails)."""
    client = service(raise_server_exceptions=False)

    async def fails(rest: str) -> None:
        raise BackendError("the backend failed")

    client.app.add_api_route("/fails/{rest}", fails, methods=["GET"])
    with caplog.at_level(logging.ERROR, "tdreplay.service"):
        assert client.get("/fails/CRITICAL%20FORGED%1B%5B31m%07").status_code == 503
    (line,) = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert line == "GET /fails/CRITICAL FORGED\\x1b[31m\\x07 failed: the backend failed", line
