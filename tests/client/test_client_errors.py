"""Server error bodies map to the client's typed errors; errors pickle."""

from __future__ import annotations

import json
import pickle

import pytest

from tdreplay.client import errors
from tdreplay.codec.protocol import ERROR_STATUS


@pytest.mark.parametrize("name,status", sorted(ERROR_STATUS.items()))
def test_every_protocol_error_has_a_class(name: str, status: int) -> None:
    body = json.dumps(
        {"type": name, "detail": f"bad {name}", "field": "next.reward", "table": "t"}
    ).encode()
    err = errors.from_response(status, body)
    assert type(err).__name__ == name
    assert isinstance(err, errors.ServerError)
    assert err.status == status and err.field == "next.reward" and err.table == "t"
    assert err.detail == f"bad {name}"
    assert "next.reward" in str(err)


def test_builtin_bases() -> None:
    assert issubclass(errors.SchemaError, ValueError)
    assert issubclass(errors.TableNotFound, KeyError)
    assert issubclass(errors.RateLimitTimeout, TimeoutError)
    assert issubclass(errors.Unauthorized, PermissionError)
    assert issubclass(errors.ConnectionFailed, ConnectionError)
    assert issubclass(errors.Timeout, TimeoutError)
    assert not issubclass(errors.ConnectionFailed, errors.ServerError)


def test_unknown_type_and_non_json_bodies() -> None:
    err = errors.from_response(418, b'{"type": "Teapot", "detail": "short and stout"}')
    assert type(err) is errors.ServerError and err.type == "Teapot" and err.status == 418
    err = errors.from_response(404, b"<html>nope</html>")  # a proxy's: not about a table
    assert type(err) is errors.NotFound and "nope" in str(err) and isinstance(err, KeyError)
    err = errors.from_response(422, b'{"detail": [{"loc": ["body"], "msg": "bad"}]}')
    assert type(err) is errors.Unprocessable and "bad" in str(err) and isinstance(err, ValueError)
    err = errors.from_response(502, b"")
    assert type(err) is errors.ServerError and err.status == 502


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (429, errors.RateLimitTimeout),
        (400, errors.InvalidRequest),
        (404, errors.NotFound),
        (422, errors.Unprocessable),
        (503, errors.BackendError),
        (507, errors.InsufficientStorage),
        (409, errors.ServerError),
        (418, errors.ServerError),
    ],
)
def test_a_newer_servers_error_type_is_the_class_of_its_status(status: int, cls: type) -> None:
    """Mixed versions: an error type this client does not know (a newer server's) was a plain
    ``ServerError``, so ``except RateLimitTimeout`` missed a newer server's 429. It is now the
    class its status stands for, with the server's name kept in ``type``; a known type stays
    its own class (``EmptyTableError``, not its base). A 404 or 422 was ``TableNotFound`` or
    ``SchemaError``, naming what a newer server's error (about a checkpoint, a route) need not
    be about: it is their base now, ``NotFound`` or ``Unprocessable``, which ``except
    TableNotFound`` / ``except SchemaError`` do not catch."""
    body = {"type": "SomethingNewer", "detail": "from the future", "field": "f", "table": "t"}
    err = errors.from_response(status, json.dumps(body).encode())
    assert type(err) is cls, type(err)
    assert (err.type, err.status, err.field, err.table) == ("SomethingNewer", status, "f", "t")
    assert err.detail == "from the future"
    assert errors.refused_for_good(err) == (status in (400, 413, 415, 422))
    known = {"type": "EmptyTableError", "detail": "table 't' holds no item", "table": "t"}
    assert type(errors.from_response(429, json.dumps(known).encode())) is errors.EmptyTableError
    assert not isinstance(err, errors.TableNotFound | errors.SchemaError)


@pytest.mark.parametrize(
    ("name", "base"), [("TableNotFound", errors.NotFound), ("SchemaError", errors.Unprocessable)]
)
def test_a_known_type_is_still_caught_by_its_own_class_and_the_status_base(
    name: str, base: type
) -> None:
    """``except TableNotFound`` still catches a table's 404 (and ``except NotFound`` too)."""
    status = errors.SERVER_ERRORS[name].status
    err = errors.from_response(status, json.dumps({"type": name, "detail": "d"}).encode())
    assert type(err) is errors.SERVER_ERRORS[name] and isinstance(err, base)


def test_errors_pickle() -> None:
    err = errors.from_response(422, b'{"type": "SchemaError", "detail": "d", "field": "obs"}')
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is errors.SchemaError and back.field == "obs" and back.status == 422
    cf = errors.ConnectionFailed("lost", url="http://x", sent=True)
    back2 = pickle.loads(pickle.dumps(cf))
    assert type(back2) is errors.ConnectionFailed and back2.sent and back2.url == "http://x"


def test_one_hierarchy_for_storage_server_and_client() -> None:
    """The storage raises, the server answers with, and the client raises the same classes:
    an error goes to its body and back to its own class, with its status and fields."""
    from tdreplay import storage
    from tdreplay.codec import errors as one
    from tdreplay.service import errors as service_errors

    for name in ERROR_STATUS:
        cls = getattr(errors, name)
        assert cls is one.ANSWERS[name]
        assert getattr(storage, name, cls) is cls and getattr(service_errors, name, cls) is cls
        assert issubclass(cls, errors.ServerError) and issubclass(cls, errors.ReplayError)
    err = storage.TableNotFound("no table 'x'", table="x", field="name", got="x")
    assert service_errors.status_of(err) == 404
    back = errors.from_response(404, json.dumps(err.to_dict()).encode())
    assert type(back) is storage.TableNotFound
    assert (back.table, back.field, back.got, back.status) == ("x", "name", "x", 404)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is storage.TableNotFound and again.table == "x" and str(again) == str(err)
    locked = pickle.loads(pickle.dumps(storage.RootLocked("busy", root="/r", pid=7)))
    assert (locked.root, locked.pid, locked.status) == ("/r", 7, 409)
    assert not issubclass(errors.TransportError, errors.ServerError)
