"""The bearer token on every route of a real server, and a reachable port never unguarded by accident.

The routes are read from the app's router, so a route added later is in the
matrix without editing this file: without the right token every route but the
probes answers 401 and changes nothing (tables, sizes, counters, files under
the data root); with it, none answers 401.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import fastapi.routing
import pytest
import testkit

from tdreplay.codec import encode, protocol
from tdreplay.service import Settings, create_app

TOKEN = "auth-matrix-t0ken"
OK = {"Authorization": f"Bearer {TOKEN}"}
#: every way of not holding the token
BAD: dict[str, dict[str, str]] = {
    "no header": {},
    "wrong token": {"Authorization": "Bearer not-the-token"},
    "wrong scheme": {"Authorization": f"Basic {TOKEN}"},
    "bare token": {"Authorization": TOKEN},
    "empty bearer": {"Authorization": "Bearer "},
    "token prefix": {"Authorization": f"Bearer {TOKEN[:-1]}"},
    "token and more": {"Authorization": f"Bearer {TOKEN}x"},
}
#: /status is the page's shell, no data (the JSON it polls is guarded)
PUBLIC = {"/healthz", "/readyz", "/status"}
REPO = Path(__file__).resolve().parents[2]


def app_routes(tmp_path: Path) -> list[tuple[str, str]]:
    """Every ``(method, path)`` the app serves, from its router (nested routers flattened)."""
    app = create_app(Settings(root=tmp_path / "unused", token=TOKEN))
    flatten = getattr(fastapi.routing, "iter_route_contexts", None)  # FastAPI >= 0.16x
    found: list[tuple[str, str]] = []
    for route in flatten(app.routes) if flatten else app.routes:
        path = getattr(route, "path_format", None) or route.path
        methods = getattr(route, "methods", None)
        if methods is None:  # a mount or a WebSocket route: reached with GET
            found.append(("GET", path + ("/x" if not path.endswith("}") else "")))
            continue
        found += [(method, path) for method in sorted(methods)]
    return found


def spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": 32,
        "fields": dict(testkit.FIELDS),
        "backend": {"kind": "memory"},
        "sampler": {"kind": "prioritized"},  # so update_priority has something to change
    }


def rows_body(start: int, n: int) -> bytes:
    return encode(testkit.rows(start, n)).to_pybytes()


def request_for(method: str, path: str, table: str = "t") -> tuple[str, bytes | None, dict]:
    """A request that would change something if it got through: a valid body for its route."""
    url = path.replace("{name}", table)
    action = path.rsplit("/", 1)[-1]
    as_json = {"Content-Type": protocol.JSON}
    if path == protocol.TABLES and method == "POST":
        return url, json.dumps(spec("intruder")).encode(), as_json
    if action == "extend":
        return url, rows_body(100, 4), {"Content-Type": protocol.ARROW_STREAM}
    if action == "sample":
        return url + "?batch_size=2&timeout=0", None, {}
    if action == "stream":
        return url + "?batch_size=2&count=1&timeout=0", None, {}
    if action == "update_priority":
        return url, json.dumps({"index": [0, 1], "priority": [5.0, 7.0]}).encode(), as_json
    if action == "checkpoint":
        return url, json.dumps({"path": "checkpoints/intruder"}).encode(), as_json
    if action == "restore":
        return url, json.dumps({"path": "checkpoints/t"}).encode(), as_json
    if action == "export":
        return url, json.dumps({"format": "csv", "path": "exports/intruder.csv"}).encode(), as_json
    if method in ("POST", "PUT", "PATCH"):
        return url, b"{}", as_json
    return url, None, {}


def send(
    server: Any, method: str, url: str, body: bytes | None = None, headers: dict | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request with exactly ``headers`` (``server.request`` would add the token)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request(method, url, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def snapshot(server: Any) -> tuple[Any, list[str]]:
    """What a request could change: the tables with their info, and the files under the root."""
    status, _, body = server.request("GET", protocol.TABLES, headers=OK)
    assert status == 200, body
    tables = {t["name"]: t for t in json.loads(body)["tables"]}
    files = sorted(str(p.relative_to(server.root)) for p in server.root.rglob("*"))
    return tables, files


@pytest.fixture(scope="module")
def guarded(live_server: Any) -> Any:
    server = live_server(token=TOKEN, fresh=True)  # its own command line is checked below
    status, _, body = server.request(
        "POST", protocol.TABLES, json.dumps(spec("t")).encode(), {"Content-Type": protocol.JSON}
    )
    assert status == 201, body
    status, _, body = server.request(
        "POST",
        protocol.table_path("t", "extend"),
        rows_body(0, 8),
        {"Content-Type": protocol.ARROW_STREAM},
    )
    assert status == 200, body
    assert TOKEN.encode() not in Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    return server


def test_the_matrix_sees_every_route(guarded: Any, tmp_path: Path) -> None:
    routes = app_routes(tmp_path)
    paths = {path for _, path in routes}
    status, _, body = guarded.request("GET", "/openapi.json", headers=OK)
    assert status == 200
    assert set(json.loads(body)["paths"]) <= paths  # the real server's routes, all in the matrix
    assert {protocol.TABLES, "/metrics", protocol.table_path("{name}", "extend")} <= paths
    assert {"/openapi.json", "/docs"} <= paths


def test_without_the_token_every_route_answers_401_and_changes_nothing(
    guarded: Any, tmp_path: Path
) -> None:
    before = snapshot(guarded)
    assert before[0]["t"]["size"] == 8
    checked = 0
    for method, path in app_routes(tmp_path):
        tables = ["t", "missing"] if "{name}" in path else ["t"]  # 401 too, not 404
        for table in tables:
            url, body, headers = request_for(method, path, table)
            for case, auth in BAD.items():
                status, got, answer = send(guarded, method, url, body, {**headers, **auth})
                where = (method, url, case)
                if path in PUBLIC:
                    assert status == 200, where
                    continue
                assert status == 401, (*where, status, answer[:200])
                assert got["www-authenticate"] == "Bearer", where
                if method != "HEAD":
                    assert json.loads(answer)["type"] == "Unauthorized", where
                assert snapshot(guarded) == before, where
                checked += 1
    assert checked >= 14 * len(BAD)
    status, _, _ = send(guarded, "GET", "/no/such/route")
    assert status == 401  # not 404: without the token, nothing tells which routes exist


def test_with_the_token_no_route_answers_401(guarded: Any, tmp_path: Path) -> None:
    routes = sorted(app_routes(tmp_path), key=lambda r: r[0] == "DELETE")  # deletions last
    for method, path in routes:
        url, body, headers = request_for(method, path)
        status, _, answer = send(guarded, method, url, body, {**headers, **OK})
        assert status != 401, (method, url, answer[:200])
        assert status < 500, (method, url, status, answer[:200])
    status, _, _ = send(
        guarded, "GET", protocol.TABLES, headers={"Authorization": "bearer " + TOKEN}
    )
    assert status == 200  # the scheme's case does not matter (RFC 9110)


# ---------------------------------------------------------------- the command line
def tdreplay(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TDREPLAY_")}
    return subprocess.run(
        [sys.executable, "-m", "tdreplay.cli", *argv],
        env={**clean, **(env or {})},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_reachable_host_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    done = tdreplay("serve", "--host", "0.0.0.0", "--port", "0", "--root", str(tmp_path / "d"))
    assert done.returncode != 0
    for fix in ("TDREPLAY_TOKEN", "--token-file", "--insecure"):
        assert fix in done.stderr, done.stderr
    assert not (tmp_path / "d").exists()  # stopped before anything started


def test_insecure_serves_a_reachable_host_without_a_token(live_server: Any) -> None:
    server = live_server("--host", "0.0.0.0", "--insecure")  # the later --host wins
    assert server.request("GET", protocol.TABLES)[0] == 200
    assert "no token (--insecure)" in server.output()


def test_the_token_flag_is_refused_without_echoing_the_token(tmp_path: Path) -> None:
    done = tdreplay("serve", "--root", str(tmp_path / "d"), "--token", "s3cret-on-argv")
    assert done.returncode == 2, done.stderr
    assert "TDREPLAY_TOKEN" in done.stderr and "--token-file" in done.stderr
    assert "s3cret-on-argv" not in done.stderr + done.stdout


def test_token_file_guards_the_server_and_stays_off_its_command_line(
    live_server: Any, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")  # as `echo` or a Kubernetes secret leaves it
    secret.chmod(0o600)
    server = live_server("--host", "0.0.0.0", "--token-file", str(secret), fresh=True)
    assert send(server, "GET", protocol.TABLES)[0] == 401
    assert server.request("GET", protocol.TABLES, headers=OK)[0] == 200
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    assert b"--token-file" in cmdline and TOKEN.encode() not in cmdline
    assert TOKEN not in server.output()
