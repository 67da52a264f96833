"""Large request bodies on a real server: any way the bytes arrive, the rows written are exact.

The server keeps a body's chunks as the parser hands them over (no copy per
chunk, ``service/server.py``) and the client sends an extend's columns from
their own memory (``codec.encode_parts``): these tests check the bytes that
land in the table, with bodies cut at odd places and sent with pauses, and
with several requests on one connection.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import pytest
import torch

from tdreplay.client import AsyncReplayClient, ReplayClient
from tdreplay.codec import encode, encode_parts, protocol

ROWS = 64
FRAME = [48, 48, 4]  # 9 KB a frame: a 64-row body is over a megabyte


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    return live_server()


def _table(server: Any, name: str) -> None:
    spec = {
        "name": name,
        "capacity": 4 * ROWS,
        "backend": {"kind": "memmap"},
        "sampler": {"kind": "fifo"},
        "fields": {
            "obs": {"shape": FRAME, "dtype": "uint8"},
            "next.done": {"shape": [1], "dtype": "bool"},
            "step": {"shape": [], "dtype": "int64"},
        },
    }
    body = json.dumps(spec).encode()
    status, _, answer = server.request(
        "POST", protocol.TABLES, body, {"Content-Type": protocol.JSON}
    )
    assert status == 201, answer


def _rows(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randint(0, 256, [ROWS, *FRAME], dtype=torch.uint8, generator=g),
        "next.done": torch.rand([ROWS, 1], generator=g) < 0.5,
        "step": torch.arange(seed * ROWS, (seed + 1) * ROWS),
    }


def _check(client: ReplayClient, table: str, sent: dict[str, torch.Tensor]) -> None:
    got = client.sample(table, ROWS)  # fifo: the rows in the order written
    assert torch.equal(got["step"], sent["step"])
    assert torch.equal(got["obs"], sent["obs"])
    assert torch.equal(got["next", "done"], sent["next.done"])


def _post_in_pieces(
    server: Any, sock: socket.socket, table: str, body: bytes, cuts: list[int]
) -> dict:
    head = (
        f"POST {protocol.TABLES}/{table}/extend HTTP/1.1\r\nHost: {server.host}\r\n"
        f"Content-Type: {protocol.ARROW_STREAM}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head)
    start = 0
    for cut in [*cuts, len(body)]:
        sock.sendall(body[start:cut])
        start = cut
        time.sleep(0.02)  # the server reads what came so far, then waits for more
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(65536)
    head_bytes, _, rest = answer.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1]
            for line in head_bytes.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    assert head_bytes.startswith(b"HTTP/1.1 200"), answer
    return json.loads(rest)


def test_a_body_cut_anywhere_and_sent_slowly_lands_exactly(server: Any) -> None:
    _table(server, "pieces")
    last = len(encode(_rows(0))) - 1
    with (
        ReplayClient(server.url, transport="http") as client,
        socket.create_connection((server.host, server.port), timeout=30) as sock,
    ):
        for seed, cuts in enumerate([[1], [7, 100_003, 400_000], [last]]):
            rows = _rows(seed)
            body = encode(rows).to_pybytes()
            assert len(body) > 500_000
            answer = _post_in_pieces(server, sock, "pieces", body, cuts)  # one connection
            assert answer["rows"] == ROWS
            _check(client, "pieces", rows)


def test_the_client_sends_columns_from_their_own_memory(server: Any) -> None:
    _table(server, "parts")
    rows = _rows(3)
    parts = encode_parts(rows)
    base = rows["obs"].data_ptr()
    views = [p for p in parts if len(p) == rows["obs"].numel()]
    assert len(views) == 1  # the frames column, uncopied
    assert torch.frombuffer(views[0], dtype=torch.uint8).data_ptr() == base
    with ReplayClient(server.url, transport="http") as client:
        for seed in (3, 4):
            rows = _rows(seed)
            assert client.extend("parts", rows).tolist() == list(
                range((seed - 3) * ROWS, (seed - 2) * ROWS)
            )
            _check(client, "parts", rows)


def test_the_async_client_sends_large_extends_exactly(server: Any) -> None:
    _table(server, "async_parts")

    async def main() -> None:
        async with AsyncReplayClient(server.url, transport="http") as client:
            for seed in (5, 6):
                await client.extend("async_parts", _rows(seed))

    asyncio.run(main())
    with ReplayClient(server.url, transport="http") as sync:
        got = sync.sample("async_parts", 2 * ROWS)
    assert got["step"].tolist() == list(range(5 * ROWS, 7 * ROWS))
    assert torch.equal(got["obs"][ROWS:], _rows(6)["obs"])


def test_chunks_are_kept_as_they_came_and_joined_when_taken() -> None:
    from tdreplay.service.bodies import BodyChunks

    body = BodyChunks()
    one = bytes(range(200)) * 400
    body += one
    assert len(body) == len(one) and bytes(body) is one  # one chunk: handed over uncopied
    body += b"tail"
    assert len(body) == len(one) + 4 and bytes(body) == one + b"tail"
    assert bytes(BodyChunks(b"left over")) == b"left over"
