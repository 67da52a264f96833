"""A request id names one request's rows over both doors of a real server: reused for other
rows of the same count it is refused (``InvalidRequest`` naming ``X-Request-Id``) and nothing
is inserted; resent with the same rows it is the retry it claims to be."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
from testkit import FIELDS, rows

from tdreplay.client import ReplayClient, ServerError
from tdreplay.codec import encode, protocol
from tdreplay.codec.request_ids import MAX_REQUEST_ID
from tdreplay.codec.shm import HEADER, extend_frame, read_request

RID = protocol.REQUEST_ID


def _http(server: Any, name: str) -> Callable[[int], tuple[int, Any]]:
    def extend(start: int) -> tuple[int, Any]:
        status, _, body = server.request(
            "POST",
            protocol.table_path(name, "extend"),
            encode(rows(start, 8)).to_pybytes(),
            {"Content-Type": protocol.ARROW_STREAM, RID: "reused"},
        )
        answer = json.loads(body)
        return status, answer["index"] if status == 200 else answer["field"]

    return extend


def _shm(client: ReplayClient, name: str) -> Callable[[int], tuple[int, Any]]:
    chan = client._driver.link(0).channel()

    def extend(start: int) -> tuple[int, Any]:
        try:
            index = chan.extend(name, rows(start, 8), 5, "reused", strict=True)
        except ServerError as err:
            return err.status, err.field
        assert index is not None
        return 200, index.tolist()

    return extend


@pytest.mark.parametrize("door", ["http", "shm"])
def test_an_id_reused_for_other_rows_is_refused(live_server: Any, door: str) -> None:
    if door == "shm" and not hasattr(os, "memfd_create"):
        pytest.skip("needs memfd_create")
    server = live_server()
    client = ReplayClient(server.url, transport=door)
    name = f"ids-{door}"
    client.create_table({"name": name, "capacity": 64, "fields": FIELDS})
    extend = _http(server, name) if door == "http" else _shm(client, name)
    assert extend(0) == (200, list(range(8)))
    assert extend(100) == (400, RID)  # the same count, other rows: no retry
    assert client.info(name)["inserts"] == 8
    assert extend(0) == (200, list(range(8)))  # the retry: answered, not inserted
    assert client.info(name)["inserts"] == 8
    client.close()


#: ids the contract refuses though they fit its length: what HTTP cannot carry as it is
UNCARRIED = {"not-latin-1": "id-€", "control": "a\x01b", "newline": "a\nb", "blank-end": "a "}
#: those a binary frame carries (latin-1): the server's check is the one that refuses them
FRAMED = ["control", "newline", "blank-end"]


@pytest.mark.parametrize(
    "request_id",
    [
        "a" * MAX_REQUEST_ID,
        "a" * (MAX_REQUEST_ID + 1),
        "a" * 256,
        "é" * MAX_REQUEST_ID,
        *UNCARRIED.values(),
    ],
    ids=["longest", "one-over", "past-the-frame", "latin-1", *UNCARRIED],
)
def test_both_doors_give_a_request_id_the_same_answer(live_server: Any, request_id: str) -> None:
    if not hasattr(os, "memfd_create"):
        pytest.skip("needs memfd_create")
    server = live_server()
    answers = []
    for door in ["http", "shm"]:
        with ReplayClient(server.url, transport=door) as client:
            name = f"id-{door}"
            client.create_table({"name": name, "capacity": 64, "fields": FIELDS})
            try:
                answers.append(client.extend(name, rows(0, 2), request_id=request_id).tolist())
            except Exception as err:  # the answer compared, whatever it is
                answers.append((type(err).__name__, getattr(err, "field", None)))
            answers.append(client.info(name)["inserts"])
    fits = len(request_id) <= MAX_REQUEST_ID and request_id not in UNCARRIED.values()
    expected = [[0, 1], 2] if fits else [("InvalidRequest", RID), 0]
    assert answers == expected * 2


def test_a_binary_extend_frame_carries_the_contracts_longest_id() -> None:
    longest = "ÿ" * MAX_REQUEST_ID  # latin-1's widest character, as an HTTP header carries it
    frame = extend_frame("t", slot=0, rows=1, timeout=None, request_id=longest)
    assert read_request(frame[HEADER.size :]).request_id == longest


@pytest.mark.parametrize("request_id", [UNCARRIED[k] for k in FRAMED], ids=FRAMED)
def test_the_shm_door_refuses_an_id_http_would_not_carry(live_server: Any, request_id: str) -> None:
    """The server's own check, past the client's: a binary frame carries any latin-1 id, and
    the server refuses there what HTTP refuses or changes (naming the id and its limit)."""
    if not hasattr(os, "memfd_create"):
        pytest.skip("needs memfd_create")
    server = live_server()
    client = ReplayClient(server.url, transport="shm")
    client.create_table({"name": "t", "capacity": 64, "fields": FIELDS})
    chan = client._driver.link(0).channel()
    try:
        with pytest.raises(ServerError) as caught:
            chan.extend("t", rows(0, 2), 5, request_id, strict=True)
        assert (caught.value.status, caught.value.field) == (400, RID)
        assert f"at most {MAX_REQUEST_ID}" in str(caught.value)
        assert client.info("t")["inserts"] == 0
    finally:
        client.close()
