"""Every limit the OpenAPI document declares is one the server enforces, door by door.

The hot routes are served by their own handlers (HOT_ROUTES), not by FastAPI's validation; both
read the same models (``tdreplay.codec.params``). This walks the
document, and for every bounded parameter sends the first value past the
bound: the answer must be 400 naming that parameter, and the table unchanged.
"""

from __future__ import annotations

from typing import Any

from service_helpers import ARROW, body, spec

from tdreplay.codec import protocol
from tdreplay.codec.params import MAX_PATH, TableKey
from tdreplay.service.core import paths
from tdreplay.storage import MAX_TABLE_NAME, TableSpec

TABLE = "t"


def _documented(client: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """``(method, path, parameter)`` for every query/header parameter with a bound."""
    doc = client.get("/openapi.json").json()
    found = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for param in op.get("parameters", []):
                schema = _plain(param.get("schema", {}))
                if param["in"] in ("query", "header") and any(
                    k in schema for k in ("minimum", "maximum", "maxLength", "exclusiveMinimum")
                ):
                    found.append((method.upper(), path, param))
    return found


def _plain(schema: dict[str, Any]) -> dict[str, Any]:
    """The bounds of a parameter's schema (``anyOf: [{...}, null]`` for optional ones)."""
    for option in schema.get("anyOf", []):
        if option.get("type") != "null":
            return option
    return schema


def _past(schema: dict[str, Any]) -> list[str]:
    """Values just past each bound of ``schema``."""
    out = []
    integer = schema.get("type") == "integer"
    step = 1 if integer else 0.001
    if "minimum" in schema:
        out.append(str(schema["minimum"] - step))
    if "exclusiveMinimum" in schema:
        out.append(str(schema["exclusiveMinimum"]))
    if "maximum" in schema:
        out.append(str(schema["maximum"] + step))
    if "maxLength" in schema:
        out.append("x" * (schema["maxLength"] + 1))
    return out


def _valid(path: str) -> dict[str, str]:
    """Values of the route's other required query parameters that pass."""
    if path.endswith(("/sample", "/stream")):
        return {"batch_size": "1"}
    if path.endswith("/load/part"):
        return {"upload": "0" * 32, "offset": "0"}
    return {"into": '{"t": null}'} if path.endswith("/insert") else {}


def test_every_documented_bound_is_enforced(service) -> None:
    client = service()
    assert client.post(protocol.TABLES, json=spec()).status_code == 201
    assert (
        client.post(
            protocol.table_path(TABLE, "extend"), content=body(0, 4), headers=ARROW
        ).status_code
        == 200
    )
    checked = []
    for method, path, param in _documented(client):
        name, where = param["name"], param["in"]
        target = path.replace("{name}", TABLE)
        for value in _past(_plain(param["schema"])):
            query = _valid(path)
            headers = dict(ARROW)
            if where == "query":
                query[name] = value
            else:
                headers[name] = value
            r = client.request(method, target, params=query, headers=headers, content=body(4, 2))
            assert r.status_code == 400, (method, path, name, value, r.text)
            assert r.json()["field"].lower() == name.lower(), (method, path, name, r.json())
            checked.append((path.rsplit("/", 1)[-1], name))
    # the hot routes' bounds are among them, so the hot handlers are what was checked
    for route, name in [
        ("sample", "batch_size"),
        ("sample", "timeout"),
        ("extend", "timeout"),
        ("extend", protocol.REQUEST_ID),
        ("stream", "batch_size"),
        ("stream", "count"),
    ]:
        assert (route, name) in checked, (route, name, checked)
    info = client.get(protocol.table_path(TABLE)).json()
    assert info["size"] == 4 and info["inserts"] == 4 and info["samples"] == 0


def test_a_bad_value_is_named_as_the_document_names_it(service) -> None:
    client = service()
    client.post(protocol.TABLES, json=spec())
    r = client.post(protocol.table_path(TABLE, "sample"), params={"batch_size": "2.5"})
    assert r.status_code == 400 and r.json()["field"] == "batch_size"
    r = client.post(
        protocol.table_path(TABLE, "sample"), params={"batch_size": 1, "timeout": "nan"}
    )
    assert r.status_code == 400 and r.json()["field"] == "timeout"
    r = client.post(protocol.table_path(TABLE, "sample"))
    assert r.status_code == 400 and r.json()["field"] == "batch_size"
    assert "required" in r.json()["detail"].lower()


def test_one_limit_of_a_table_name_for_every_door(service) -> None:
    """A table's name has one limit (``codec.protocol.MAX_TABLE_NAME``): the route's ``{name}``
    (in the OpenAPI document), the parameter naming a table (an insert's tables), the
    spec's name rule and the server's own paths are held to it; it was written out in three."""
    limit = protocol.MAX_TABLE_NAME
    assert limit == MAX_TABLE_NAME
    assert paths.MAX_PATH is MAX_PATH  # a client path's limit: the contract's
    doc = service().get("/openapi.json").json()
    named = [
        p["schema"]
        for ops in doc["paths"].values()
        for op in ops.values()
        for p in op.get("parameters", [])
        if p["in"] == "path" and p["name"] == "name"
    ]
    assert named and all(s.get("maxLength") == limit for s in named)
    assert [m.max_length for m in TableKey.__metadata__] == [limit]
    fields = {"x": {"shape": [], "dtype": "int64"}}
    TableSpec.model_validate({"name": "a" * limit, "capacity": 1, "fields": fields})
    try:
        TableSpec.model_validate({"name": "a" * (limit + 1), "capacity": 1, "fields": fields})
    except ValueError:
        pass
    else:
        raise AssertionError(f"a name of {limit + 1} characters passed the spec's rule")
