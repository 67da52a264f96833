"""Every rejected request answers {type, detail, field} with the protocol's status and writes nothing."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
import torch
from service_helpers import ARROW, body, create, extend, info, rows

from tdreplay.codec import encode, protocol

EXTEND = protocol.table_path("t", "extend")
SAMPLE = protocol.table_path("t", "sample")


def _without(key: str) -> bytes:
    td = rows(0, 4)
    td.del_(tuple(key.split(".")))
    return encode(td).to_pybytes()


def _with(key: str, value: torch.Tensor) -> bytes:
    td = rows(0, 4)
    td.set(tuple(key.split(".")), value)
    return encode(td).to_pybytes()


def _two_batches() -> bytes:
    rb = pa.record_batch({"id": pa.array([1, 2], pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema) as w:
        w.write_batch(rb)
        w.write_batch(rb)
    return sink.getvalue().to_pybytes()


BAD_EXTENDS: list[tuple[str, bytes, dict[str, str], int, str, str | None]] = [
    ("missing key", _without("next.done"), ARROW, 422, "SchemaError", "next.done"),
    (
        "extra key",
        _with("extra", torch.zeros(4)),
        ARROW,
        422,
        "SchemaError",
        "extra",
    ),
    (
        "wrong shape",
        _with("observation", torch.zeros(4, 4)),
        ARROW,
        422,
        "SchemaError",
        "observation",
    ),
    (
        "wrong dtype",
        _with("pixels", torch.zeros(4, 2, 2, dtype=torch.int16)),
        ARROW,
        422,
        "SchemaError",
        "pixels",
    ),
    ("malformed arrow", b"\x00not arrow at all" * 10, ARROW, 400, "CodecError", None),
    ("truncated arrow", body(0, 4)[:-40], ARROW, 400, "CodecError", None),
    ("two record batches", _two_batches(), ARROW, 400, "CodecError", None),
    (
        "wrong content type",
        body(0, 4),
        {"Content-Type": "application/json"},
        415,
        "UnsupportedMediaType",
        "Content-Type",
    ),
    ("no content type", body(0, 4), {}, 415, "UnsupportedMediaType", "Content-Type"),
    ("too large", body(0, 64), ARROW, 413, "PayloadTooLarge", "body"),
    ("over capacity", body(0, 65), ARROW, 413, "PayloadTooLarge", "body"),
]


def _state(client: Any) -> tuple[int, int, int]:
    got = info(client)
    return got["size"], got["inserts"], got["bytes_in"]


@pytest.mark.parametrize(
    ("case", "data", "headers", "status", "type_", "field"),
    BAD_EXTENDS,
    ids=[c[0] for c in BAD_EXTENDS],
)
def test_rejected_extend_writes_nothing(
    service, case: str, data: bytes, headers: dict, status: int, type_: str, field: str | None
) -> None:
    client = service(max_body_bytes=len(body(0, 32)))
    create(client, capacity=64)
    assert extend(client, 100, 3).status_code == 200
    before = _state(client)
    r = client.post(EXTEND, content=data, headers=headers)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["type"] == type_
    assert isinstance(err["detail"], str) and err["detail"]
    assert err["field"] == field
    assert protocol.ERROR_STATUS[type_] == status
    assert _state(client) == before
    # nothing half-written either: every stored row is still a whole item
    from service_helpers import assert_rows_match

    from tdreplay.codec import decode

    assert_rows_match(decode(client.post(SAMPLE, params={"batch_size": 16}).content))


def test_unknown_table_is_404(service) -> None:
    client = service()
    for method, path in [
        ("POST", protocol.table_path("nope", "extend")),
        ("POST", protocol.table_path("nope", "sample") + "?batch_size=1"),
        ("POST", protocol.table_path("nope", "stream") + "?batch_size=1"),
        ("GET", protocol.table_path("nope")),
        ("DELETE", protocol.table_path("nope")),
    ]:
        r = client.request(method, path, content=body(0, 1), headers=ARROW)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json() == {
            "type": "TableNotFound",
            "detail": "no table 'nope'",
            "field": "name",
            "table": "nope",
            "got": "nope",
        }
    for action, params in [
        ("checkpoint", {}),
        ("export", {}),
        ("update_priority", {"index": [], "priority": []}),
    ]:  # each with a body its operation takes (a field it does not know is a 400)
        r = client.post(protocol.table_path("nope", action), json=params)
        assert r.status_code == 404, (action, r.text)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": "x"}, "batch_size"),
        ({}, "batch_size"),
        ({"batch_size": 65}, "batch_size"),
        ({"batch_size": 1, "timeout": -1}, "timeout"),
        ({"batch_size": 1, "timeout": "nan"}, "timeout"),
    ],
)
def test_bad_sample_parameters_are_400(service, params: dict, field: str) -> None:
    client = service()
    create(client)
    extend(client, 0, 4)
    before = info(client)["samples"]
    r = client.post(SAMPLE, params=params)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "InvalidRequest" and r.json()["field"] == field
    assert info(client)["samples"] == before


def test_sample_over_body_limit_is_413(service) -> None:
    client = service(max_body_bytes=2000)
    create(client, capacity=64)
    extend(client, 0, 8)
    r = client.post(SAMPLE, params={"batch_size": 64})
    assert r.status_code == 413 and r.json()["type"] == "PayloadTooLarge"


def test_every_answer_of_items_has_one_body_limit_check(service) -> None:
    """A sample and a read past ``--max-body-bytes`` are refused by one check (the handle's
    ``check_answer``): the same 413 naming the flag and each its own parameter, nothing
    sampled. The two were written apart, and neither named the flag."""
    client = service(max_body_bytes=2000)
    create(client, capacity=64)
    extend(client, 0, 64)
    before = info(client)["samples"]
    sampled = client.post(SAMPLE, params={"batch_size": 64})
    read = client.post(protocol.table_path("t", "read"), json={"index": list(range(64))})
    for r, field in ((sampled, "batch_size"), (read, "index")):
        assert r.status_code == 413, r.text
        err = r.json()
        assert err["type"] == "PayloadTooLarge" and err["field"] == field and err["got"] == "64"
        assert err["detail"] == (
            "table 't': 64 items exceed the server's body limit of 2000 bytes "
            "(--max-body-bytes); ask for fewer at a time"
        )
    assert info(client)["samples"] == before


def test_rate_limit_timeout_is_429(service) -> None:
    client = service()
    create(client, rate_limiter={"min_size_to_sample": 10})
    extend(client, 0, 4)
    r = client.post(SAMPLE, params={"batch_size": 2, "timeout": 0.05})
    assert r.status_code == 429
    err = r.json()
    assert err["type"] == "RateLimitTimeout" and err["table"] == "t"
    assert "min_size_to_sample 10" in err["detail"]
    assert info(client)["samples"] == 0


def test_server_errors_leak_nothing(service, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    client = service(raise_server_exceptions=False)
    create(client)
    extend(client, 0, 4)
    table = client.app.state.core.table("t").table

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internals at /srv/private")

    monkeypatch.setattr(table, "try_sample", broken)
    r = client.post(SAMPLE, params={"batch_size": 1})
    assert r.status_code == 500
    assert r.json() == {"type": "InternalError", "detail": "internal server error", "field": None}
    assert "secret" not in r.text and "Traceback" not in r.text
    assert "secret internals" in caplog.text  # logged server side


@pytest.mark.parametrize(
    ("path", "text", "why"),
    [
        (protocol.TABLES, b'{"name": ', "Expecting value at character 9"),
        (protocol.table_path("t", "update_priority"), b'{"index": [1, 2', "at character 15"),
        (protocol.table_path("t", "checkpoint"), b"{'path': 1}", "Expecting property name"),
    ],
)
def test_a_json_body_that_does_not_parse_says_where_and_why(
    service, path: str, text: bytes, why: str
) -> None:
    client = service()
    create(client)
    r = client.post(path, content=text, headers={"Content-Type": protocol.JSON})
    assert r.status_code == 400, r.text
    error = r.json()
    assert (error["type"], error["field"]) == ("InvalidRequest", "body"), error
    assert error["detail"].startswith("invalid JSON body: ") and why in error["detail"], error
