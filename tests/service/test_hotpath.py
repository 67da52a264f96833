"""The hot routes (extend, sample) served past the router answer as the framework would."""

from __future__ import annotations

from service_helpers import body, create, extend

from tdreplay.codec import protocol

ARROW = {"Content-Type": protocol.ARROW_STREAM}


def test_errors_on_the_hot_routes_are_the_protocols(service) -> None:
    client = service()
    create(client, capacity=20)
    extend(client, 0, 8)
    cases = [
        (protocol.table_path("nope", "sample"), {"batch_size": 1}, 404, "TableNotFound", None),
        (protocol.table_path("t", "sample"), {"batch_size": "x"}, 400, None, "batch_size"),
        (
            protocol.table_path("t", "sample"),
            {"batch_size": 999},
            400,
            "InvalidRequest",
            "batch_size",
        ),
        (
            protocol.table_path("t", "sample"),
            {"batch_size": 1, "timeout": -1},
            400,
            None,
            "timeout",
        ),
    ]
    for path, params, status, type_, field in cases:
        r = client.post(path, params=params)
        assert r.status_code == status, (path, params, r.text)
        error = r.json()
        assert set(error) >= {"type", "detail", "field"}
        if type_ is not None:
            assert error["type"] == type_
        if field is not None:
            assert error["field"] == field
    r = client.post(protocol.table_path("t", "extend"), content=b"not arrow", headers=ARROW)
    assert r.status_code == 400 and r.json()["type"] == "CodecError"
    r = client.post(protocol.table_path("t", "extend"), content=body(0, 2))  # no media type
    assert r.status_code == 415
    assert client.get("/v1/tables/t").json()["size"] == 8  # nothing refused was written


def test_what_is_not_a_hot_route_goes_through_the_router(service) -> None:
    client = service()
    create(client, capacity=20)
    extend(client, 0, 4)
    assert client.get(protocol.table_path("t", "sample")).status_code == 405  # GET: the router's
    r = client.post("/v1/tables/t/x/sample", params={"batch_size": 1})  # two segments: no route
    assert r.status_code == 404 and r.json()["type"] == "InvalidRequest"
    assert (
        client.post(protocol.table_path("t", "sample"), params={"batch_size": 2}).status_code == 200
    )


def test_the_token_guards_the_hot_routes(service) -> None:
    client = service(token="s3cret-token-for-tests")
    auth = {"Authorization": "Bearer s3cret-token-for-tests"}
    r = client.post(
        protocol.TABLES,
        json={"name": "t", "capacity": 8, "fields": {"x": {"dtype": "float32"}}},
        headers=auth,
    )
    assert r.status_code == 201, r.text
    for op in ("sample", "extend"):
        r = client.post(protocol.table_path("t", op), params={"batch_size": 1})
        assert r.status_code == 401 and r.json()["type"] == "Unauthorized"
