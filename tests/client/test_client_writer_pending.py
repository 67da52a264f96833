"""What a writer holds after failed sends, against real servers: a chunk the server refuses for
good leaves the writer (it would fail every later send), any other failed chunk is kept; and
past ``max_pending`` chunks kept, ``append`` sends what is kept first or refuses the step, so a
collector's memory stays bounded while its server is down, and nothing is lost or doubled
when the server comes back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import (
    AsyncReplayClient,
    BackendError,
    ConnectionFailed,
    InsufficientStorage,
    InternalError,
    InvalidRequest,
    PayloadTooLarge,
    RateLimitTimeout,
    ReplayClient,
    SchemaError,
    ServerError,
    TableClosed,
    TableNotFound,
    Timeout,
    Unauthorized,
    UnsupportedMediaType,
)
from tdreplay.client.errors import CodecError, refused_for_good
from tdreplay.client.writer import Writer

#: ``x`` takes 100 categories: a chunk holding 100 or more is refused (400) whatever happens
FIELDS = {"x": {"shape": [], "dtype": "int64", "n": 100}}
POISON = 999


@pytest.fixture(scope="module")
def client(server: Any) -> ReplayClient:
    return ReplayClient(server.url, timeout=30)


def spec(name: str) -> dict[str, Any]:
    return {"name": name, "capacity": 64, "fields": FIELDS}


def steps(*xs: int) -> TensorDict:
    return TensorDict({"x": torch.tensor(xs, dtype=torch.int64)}, [len(xs)])


def stored(client: ReplayClient, name: str) -> list[int]:
    """The table's ``x`` in slot order."""
    return client.read(name, torch.arange(client.info(name)["size"]))["x"].tolist()


def notes(err: BaseException) -> str:
    return "\n".join(getattr(err, "__notes__", []))


# ------------------------------------------------------------------ the rule
def test_the_requests_refused_for_good_are_the_ones_no_server_change_lets_pass() -> None:
    """The request's own fault (400, 413, 415, 422) is for good; the server's state (a table
    re-created, busy, failing, full, a token, a crash) and a lost answer are not."""
    for err in (
        SchemaError("x"),
        InvalidRequest("x"),
        CodecError("x"),
        PayloadTooLarge("x"),
        UnsupportedMediaType("x"),
        ServerError("a newer server's type", status=422, type="Newer"),
    ):
        assert refused_for_good(err), err
    for other in (
        TableNotFound("x"),
        TableClosed("x"),
        RateLimitTimeout("x"),
        BackendError("x"),
        InsufficientStorage("x"),
        Unauthorized("x"),
        InternalError("x"),
        ConnectionFailed("x", sent=True),
        Timeout("x"),
        ValueError("not tdreplay's"),
    ):
        assert not refused_for_good(other), other


# ------------------------------------------------------------------ a chunk refused for good
def test_a_chunk_refused_for_good_leaves_the_writer(client: ReplayClient, make_writer: Any) -> None:
    """One append brings 3 chunks; the second holds a value outside the field's categories.
    It is dropped, the error says so and counts it; the third is kept and goes with the next
    send (before, the refused chunk was sent again first by every send, each refused)."""
    name = unique("wp")
    client.create_table(spec(name))
    w = make_writer(client, name, chunk=2, max_delay=None)
    with pytest.raises(InvalidRequest, match="outside its 100 categories") as got:
        w.append(steps(0, 1, POISON, 2, 3, 4))  # from this thread: raised here
        w.flush()  # in the background: raised by the next call
    told = notes(got.value)
    assert "refused a chunk of 2 row(s) for good" in told and "2 row(s) dropped" in told
    assert "2 row(s) not acknowledged are kept" in told
    assert w.kept_rows == 2 and w.dropped_rows == 2
    w.append(steps(5, 6))
    w.close()
    assert stored(client, name) == [0, 1, 3, 4, 5, 6] and w.kept_rows == 0


def test_a_chunk_refused_for_good_by_the_time_limit_leaves_the_writer(
    client: ReplayClient,
) -> None:
    name = unique("wpt")
    client.create_table(spec(name))
    w = Writer(client, name, chunk=100, max_delay=0.0)
    w.append(steps(POISON))
    with pytest.raises(InvalidRequest) as got:
        w.wait_sent(1, timeout=30)
    assert "1 row(s) dropped" in notes(got.value) and w.kept_rows == 0
    w.append(steps(1))
    w.close()
    assert stored(client, name) == [1]


def test_an_async_chunk_refused_for_good_leaves_the_writer(
    server: Any, client: ReplayClient
) -> None:
    name = unique("awp")
    client.create_table(spec(name))

    async def main() -> None:
        async with AsyncReplayClient(server.url) as aclient:
            w = aclient.writer(name, chunk=2, max_delay=None)
            with pytest.raises(InvalidRequest) as got:
                await w.append(steps(0, 1, POISON, 2, 3, 4))
            assert "refused a chunk of 2 row(s) for good" in notes(got.value)
            assert w.kept_rows == 2 and w.dropped_rows == 2
            await w.append(steps(5, 6))
            await w.aclose()

    asyncio.run(main())
    assert stored(client, name) == [0, 1, 3, 4, 5, 6]


def test_a_chunk_over_the_servers_body_limit_leaves_the_writer(live_server: Any) -> None:
    """A 413 (``--max-body-bytes``) is the chunk's own size: a smaller chunk passes."""
    small = live_server(max_body_bytes=4096)
    client = ReplayClient(small.url, transport="http")
    name = unique("wpl")
    wide = {**FIELDS, "obs": {"shape": [64], "dtype": "float32"}}  # 256 B a row
    client.create_table({**spec(name), "fields": wide})
    w = client.writer(name, chunk=32, max_delay=None)

    def rows(*xs: int) -> TensorDict:
        return steps(*xs).set("obs", torch.zeros(len(xs), 64))

    with pytest.raises(PayloadTooLarge) as got:
        w.append(rows(*range(32)))  # 8 KiB, posted: its answer is read by the next send
        w.flush()
    assert "32 row(s) dropped" in notes(got.value) and w.kept_rows == 0
    w.append(rows(7))
    w.close()
    assert stored(client, name) == [7]


# ------------------------------------------------------------------ the cap, the server down
def schema_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec(name)))  # memmap: the rows outlive the process
    return path


def test_max_pending_is_a_count_of_chunks(client: ReplayClient) -> None:
    with pytest.raises(ValueError, match="max_pending must be >= 1, got 0"):
        client.writer("any", max_pending=0)
    with pytest.raises(TypeError, match="max_pending must be an int"):
        client.writer("any", max_pending=2.5)  # type: ignore[arg-type]


def test_a_writer_full_while_the_server_is_down_refuses_steps_then_delivers_once(
    live_server: Any, tmp_path: Path
) -> None:
    """chunk 4, max_pending 2: with the server stopped two chunks fail and are kept (8 rows);
    the next append re-sends them, fails, and refuses its step, again and again, the writer
    growing no more (before, each append took its step: kept rows grew without end). The
    server restarted on the same root, the next append delivers the 8 rows, then takes its
    step; every step taken is stored once."""
    name = unique("wfull")
    schema, root = schema_file(tmp_path, name), tmp_path / "data"
    server = live_server(schema=schema, root=root)
    client = ReplayClient(server.url)
    w = client.writer(name, chunk=4, max_delay=None, max_pending=2, background=False)
    w.append(steps(0, 1, 2, 3))
    assert w.sent_rows == 4
    server.stop()
    for first in (4, 8):  # each taken, its send failed: kept
        with pytest.raises(ConnectionFailed):
            w.append(steps(first, first + 1, first + 2, first + 3))
    assert w.kept_rows == 8
    for _ in range(3):
        with pytest.raises(ConnectionFailed) as got:
            w.append(steps(12))
        assert "is full: it holds 8 row(s) not acknowledged" in notes(got.value)
        assert w.kept_rows == 8  # the step was not taken
    server = live_server(schema=schema, root=root, port=server.port)
    w.append(steps(12))  # what is kept goes first
    assert w.kept_rows == 0 and w.sent_rows == 12
    w.close()
    assert stored(client, name) == list(range(13))


def test_an_async_writer_full_while_the_server_is_down_refuses_steps_then_delivers_once(
    live_server: Any, tmp_path: Path
) -> None:
    name = unique("awfull")
    schema, root = schema_file(tmp_path, name), tmp_path / "data"
    server = live_server(schema=schema, root=root)

    async def down_then_up() -> None:
        nonlocal server
        async with AsyncReplayClient(server.url) as aclient:
            w = aclient.writer(name, chunk=4, max_delay=None, max_pending=1)
            await w.append(steps(0, 1, 2, 3))
            server.stop()
            with pytest.raises(ConnectionFailed):
                await w.append(steps(4, 5, 6, 7))
            for _ in range(2):
                with pytest.raises(ConnectionFailed) as got:
                    await w.append(steps(8))
                assert "is full: it holds 4 row(s)" in notes(got.value) and w.kept_rows == 4
            server = live_server(schema=schema, root=root, port=server.port)
            await w.append(steps(8))
            assert w.sent_rows == 8
            await w.aclose()

    asyncio.run(down_then_up())
    assert stored(ReplayClient(server.url), name) == list(range(9))
