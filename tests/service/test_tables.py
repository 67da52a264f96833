"""Tables over HTTP: list, create from a schema, info, delete; schemas loaded on start; probes."""

from __future__ import annotations

from pathlib import Path

import yaml
from service_helpers import create, extend, info, spec

from tdreplay.codec import protocol


def test_probes_and_empty_list(service) -> None:
    client = service()
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {
        "status": "ready", "tables": 0, "lost": 0, "unreachable": 0, "failed": 0,
    }  # fmt: skip
    assert client.get(protocol.TABLES).json() == {"tables": [], "unavailable": {}}


def test_create_info_list_delete(service) -> None:
    client = service()
    created = create(client, "t", capacity=32)
    assert created["name"] == "t"
    assert created["size"] == 0 and created["capacity"] == 32
    assert created["backend"] == "memory"
    assert created["sampler"]["kind"] == "uniform"
    assert created["rate_limiter"]["min_size_to_sample"] == 1
    assert created["waiting"] == {"insert": 0, "sample": 0}
    assert extend(client, 0, 5).status_code == 200
    got = info(client)
    assert (got["size"], got["inserts"], got["samples"]) == (5, 5, 0)
    assert [t["name"] for t in client.get(protocol.TABLES).json()["tables"]] == ["t"]
    r = client.delete(protocol.table_path("t"))
    assert r.status_code == 204 and r.content == b""
    r = client.get(protocol.table_path("t"))
    assert r.status_code == 404
    assert r.json()["type"] == "TableNotFound"


def test_duplicate_is_409(service) -> None:
    client = service()
    create(client, "t")
    r = client.post(protocol.TABLES, json=spec("t"))
    assert r.status_code == 409
    assert r.json()["type"] == "TableExists"


def test_bad_schema_is_422_naming_the_field(service) -> None:
    client = service()
    bad = spec("t")
    bad["fields"]["observation"] = {"shape": [3], "dtype": "float128"}
    r = client.post(protocol.TABLES, json=bad)
    assert r.status_code == 422
    err = r.json()
    assert err["type"] == "SchemaError"
    assert "fields.observation.dtype" in err["field"]
    r = client.post(protocol.TABLES, json={**spec("t"), "capacity": 0})
    assert r.status_code == 422 and r.json()["field"] == "capacity"
    r = client.post(
        protocol.TABLES, content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["type"] == "InvalidRequest"
    assert client.get(protocol.TABLES).json() == {"tables": [], "unavailable": {}}


def test_create_if_absent_is_one_operation(service) -> None:
    client = service()
    url = protocol.TABLES + "?if_absent=true"
    first = client.post(url, json=spec("t", capacity=32))
    again = client.post(url, json=spec("t", capacity=32))
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["name"] == "t" and again.json()["capacity"] == 32
    assert extend(client, 0, 4).status_code == 200
    assert client.post(url, json=spec("t", capacity=32)).json()["size"] == 4  # the same table
    other = client.post(url, json=spec("t", capacity=64))
    assert other.status_code == 409 and other.json()["type"] == "TableExists"
    assert "capacity: 32 on the server, 64 asked" in other.json()["detail"]
    assert other.json()["field"] == "capacity"
    assert client.post(protocol.TABLES, json=spec("t", capacity=32)).status_code == 409


def test_names_are_checked_whole(service, tmp_path: Path) -> None:
    """A name is a file name on the server: one that only starts right ("obs\n": ``$``
    matches before a final newline) is refused before anything is made."""
    client = service()
    for bad in [
        {**spec("t"), "fields": {"obs\n": {"shape": [], "dtype": "int64"}}},
        {
            **spec("t"),
            "backend": {"kind": "memmap"},
            "fields": {"a.b\n": {"shape": [], "dtype": "int64"}},
        },
        {**spec("t\n")},
    ]:
        r = client.post(protocol.TABLES, json=bad)
        assert r.status_code == 422 and r.json()["type"] == "SchemaError", r.json()
    assert client.get(protocol.TABLES).json()["tables"] == []
    assert not (tmp_path / "data" / "tables").exists() or not list(
        (tmp_path / "data" / "tables").iterdir()
    )


def test_server_policy_on_client_tables(service) -> None:
    client = service(allowed_backends=["memory"], max_table_bytes=10_000)
    r = client.post(protocol.TABLES, json={**spec("a"), "backend": {"kind": "memmap"}})
    assert r.status_code == 403 and r.json()["type"] == "Forbidden"
    assert r.json()["field"] == "backend.kind"
    r = client.post(protocol.TABLES, json=spec("b", capacity=100_000))
    assert r.status_code == 422 and r.json()["field"] == "capacity"
    assert client.get(protocol.TABLES).json() == {"tables": [], "unavailable": {}}


def test_a_schema_names_no_path(service, tmp_path: Path) -> None:
    client = service()
    outside = tmp_path / "outside"
    for path in ["../outside", str(outside), ".", "mine/store"]:
        r = client.post(
            protocol.TABLES, json={**spec("m"), "backend": {"kind": "memmap", "path": path}}
        )
        assert r.status_code == 422, (path, r.text)
        assert "path" in r.json()["detail"]
    assert not outside.exists()
    r = client.post(protocol.TABLES, json={**spec("m"), "backend": {"kind": "memmap"}})
    assert r.status_code == 201
    assert r.json()["location"] == "tables/m/storage"  # relative to the data root


def test_schemas_loaded_on_start(service, tmp_path: Path) -> None:
    folder = tmp_path / "schemas"
    folder.mkdir()
    for name in ("a", "b"):
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec(name, capacity=8)))
    (folder / "table.schema.json").write_text("{}")  # the JSON Schema itself is skipped
    client = service(schema_path=folder)
    assert client.get("/readyz").json()["tables"] == 2
    one = service(schema_path=folder / "a.yaml", root=tmp_path / "other")
    assert [t["name"] for t in one.get(protocol.TABLES).json()["tables"]] == ["a"]


def test_backend_override(service) -> None:
    client = service(schema_path="schemas/cartpole.yaml", backend="memory")
    assert info(client, "cartpole")["backend"] == "memory"


def test_unknown_route_and_method(service) -> None:
    client = service()
    r = client.get("/v2/nothing")
    assert r.status_code == 404 and r.json()["type"] == "InvalidRequest"
    r = client.put(protocol.TABLES)
    assert r.status_code == 405 and r.json()["type"] == "InvalidRequest"


def test_openapi_documents_arrow_bodies(service) -> None:
    client = service()
    doc = client.get("/openapi.json").json()
    extend_op = doc["paths"]["/v1/tables/{name}/extend"]["post"]
    assert protocol.ARROW_STREAM in extend_op["requestBody"]["content"]
    assert {p["name"] for p in extend_op["parameters"]} >= {"name", "timeout", "X-Request-Id"}
    sample_op = doc["paths"]["/v1/tables/{name}/sample"]["post"]
    assert protocol.ARROW_STREAM in sample_op["responses"]["200"]["content"]
    assert "429" in sample_op["responses"]
    assert client.get("/docs").status_code == 200
