"""Bearer token on every route but the probes; client paths confined to the data root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from service_helpers import create, extend

from tdreplay.codec import protocol

TOKEN = "s3cret-token"


def test_token_guards_every_route_but_the_probes(service) -> None:
    client = service(token=TOKEN)
    ok = {"Authorization": f"Bearer {TOKEN}"}
    documented = client.app.openapi()["paths"]
    routes = [(path, method.upper()) for path, ops in documented.items() for method in ops]
    routes += [("/openapi.json", "GET"), ("/docs", "GET"), ("/redoc", "GET")]
    assert len(routes) == 29  # 26 routes of the protocol (GET /v1/info, /v1/status too) + the docs
    assert ("/v1/info", "GET") in routes
    for path, method in routes:
        url = path.replace("{name}", "t")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = client.request(method, url, headers=headers)
            if path in ("/healthz", "/readyz"):
                assert r.status_code == 200, path
                continue
            assert r.status_code == 401, (method, path, headers)
            assert r.json()["type"] == "Unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
    assert client.get(protocol.TABLES, headers=ok).status_code == 200
    assert client.get("/metrics", headers=ok).status_code == 200
    assert client.get("/openapi.json", headers=ok).json()["components"]["securitySchemes"]


def test_unauthorized_requests_change_nothing(service) -> None:
    client = service(token=TOKEN)
    ok = {"Authorization": f"Bearer {TOKEN}"}
    client.headers.update(ok)
    create(client)
    client.headers.pop("Authorization")
    r = client.delete(protocol.table_path("t"))
    assert r.status_code == 401
    r = extend(client, 0, 2)
    assert r.status_code == 401
    assert client.get(protocol.table_path("t"), headers=ok).json()["size"] == 0


def test_the_scheme_is_case_insensitive_and_the_token_exact(service) -> None:
    client = service(token=TOKEN)
    for auth, status in [
        (f"Bearer {TOKEN}", 200),
        (f"bearer {TOKEN}", 200),
        (f"BEARER {TOKEN}", 200),
        (f"Basic {TOKEN}", 401),
        (f"Bearer  {TOKEN}", 401),
        (f"Bearer {TOKEN} ", 401),
        (f"Bearer {TOKEN.upper()}", 401),
        ("Bearer", 401),
    ]:
        r = client.get(protocol.TABLES, headers={"Authorization": auth})
        assert r.status_code == status, auth


def test_bearer_auth_fails_closed() -> None:
    import asyncio

    from tdreplay.service.security import BearerAuth

    with pytest.raises(ValueError):
        BearerAuth(lambda *a: None, token=b"")  # type: ignore[arg-type]
    reached: list[str] = []
    sent: list[dict] = []

    async def app(scope, receive, send) -> None:
        reached.append(scope["type"])

    async def send(message: dict) -> None:
        sent.append(message)

    guard = BearerAuth(app, token=b"tok")
    ws = {"type": "websocket", "path": "/v1/ws", "headers": []}
    asyncio.run(guard(ws, None, send))  # type: ignore[arg-type]
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]
    ws["headers"] = [(b"authorization", b"Bearer tok")]
    asyncio.run(guard(ws, None, send))  # type: ignore[arg-type]
    asyncio.run(guard({"type": "lifespan"}, None, send))  # type: ignore[arg-type]
    assert reached == ["websocket", "lifespan"]


@pytest.mark.parametrize("action", ["checkpoint", "restore", "export"])
def test_paths_outside_the_root_are_refused(service, tmp_path: Path, action: str) -> None:
    client = service()
    create(client)
    extend(client, 0, 4)
    root = tmp_path / "data"
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    for path in [
        "../outside/x",
        "../../etc/x",
        str(outside / "x"),
        "/etc/x",
        "link/x",
        ".",
        "",
        "a/../../x",
        "x\x00y",
        "n" * 300,
    ]:
        r = client.post(protocol.table_path("t", action), json={"path": path})
        assert r.status_code == 400, (action, path, r.text)
        assert r.json()["type"] == "InvalidRequest" and r.json()["field"] == "path"
    assert os.listdir(outside) == []


def test_paths_outside_their_area_are_refused(service, tmp_path: Path) -> None:
    """Checkpoints live in checkpoints/, exports in exports/; tables/ is out of every client's reach."""
    client = service()
    r = client.post(
        protocol.TABLES,
        json={
            "name": "m",
            "capacity": 8,
            "fields": {"x": {"shape": [], "dtype": "int64"}},
            "backend": {"kind": "memmap"},
        },
    )
    assert r.status_code == 201
    storage = tmp_path / "data" / "tables" / "m" / "storage"
    before = sorted(p.relative_to(storage) for p in storage.rglob("*"))
    for path in ["m", "tables/m", "tables/m/storage", "tables/m/storage/x", "exports/c", "x"]:
        r = client.post(protocol.table_path("m", "checkpoint"), json={"path": path})
        assert r.status_code == 400, (path, r.text)
        assert "checkpoints/" in r.json()["detail"]
    for path in ["tables/m/storage", "tables/m/x.csv", "checkpoints/x.csv", "x.csv"]:
        r = client.post(protocol.table_path("m", "export"), json={"path": path})
        assert r.status_code == 400, (path, r.text)
    r = client.post(protocol.table_path("m", "export"), json={"path": "exports/beside.csv"})
    assert r.status_code == 200
    assert sorted(p.relative_to(storage) for p in storage.rglob("*")) == before


def test_checkpoint_does_not_replace_what_is_not_a_checkpoint(service, tmp_path: Path) -> None:
    client = service()
    create(client)
    extend(client, 0, 4)
    keep = tmp_path / "data" / "checkpoints" / "user" / "keep"
    keep.mkdir(parents=True)
    (keep / "precious.txt").write_text("x")
    r = client.post(protocol.table_path("t", "checkpoint"), json={"path": "checkpoints/user/keep"})
    assert r.status_code == 409 and r.json()["type"] == "PathExists"
    assert (keep / "precious.txt").read_text() == "x"
    r = client.post(
        protocol.table_path("t", "checkpoint"),
        json={"path": "checkpoints/user/keep/precious.txt/x"},
    )
    assert r.status_code == 400
