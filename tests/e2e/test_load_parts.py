"""A load larger than the server's --max-body-bytes (issue 21 item 1): the dump goes up in
parts (load_begin / load_part / load_commit), each one request within the limit, staged
on the server and restored only once whole; against real servers with a 1 MiB limit."""

from __future__ import annotations

import io
import json
import socket
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.client import (
    AsyncReplayClient,
    CodecError,
    InvalidRequest,
    PayloadTooLarge,
    ReplayClient,
)
from tdreplay.codec import protocol

LIMIT = 1 << 20  # --max-body-bytes of every server here
ROW = 256  # floats per observation: a row is 1 KiB and some


def big_spec(name: str, capacity: int = 4096) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": capacity,
        "fields": {
            "id": {"shape": [], "dtype": "int64"},
            "observation": {"shape": [ROW], "dtype": "float32"},
        },
        "backend": {"kind": "memory"},
        "sampler": {"kind": "prioritized"},
    }


def fill(client: ReplayClient, table: str, start: int, n: int) -> None:
    """Items ``start .. start+n-1`` (every value encodes the item id), 512 per extend."""
    for first in range(start, start + n, 512):
        ids = torch.arange(first, min(first + 512, start + n))
        obs = ids[:, None].float().expand(len(ids), ROW) + torch.arange(ROW) / ROW
        client.extend(table, TensorDict({"id": ids, "observation": obs}, [len(ids)]))


def staged(server: Any) -> list[Path]:
    """What the server holds of loads under way (and of one-request loads, dumps)."""
    folder = server.root / ".transfers"
    return sorted(folder.iterdir()) if folder.exists() else []


def files(dump: Path) -> dict[str, Any]:
    """A dump's contents: each file's bytes, the metadata as JSON less its timestamp and
    its checkpoint's id (each checkpoint's own)."""
    out: dict[str, Any] = {}
    for path in sorted(p for p in dump.rglob("*") if p.is_file()):
        name = str(path.relative_to(dump))
        out[name] = path.read_bytes()
        if name == "metadata.json":
            meta = json.loads(out[name]).items()
            out[name] = {k: v for k, v in meta if k not in ("created_at", "checkpoint_id")}
    return out


def test_a_dump_several_times_the_body_limit_round_trips(live_server: Any, tmp_path: Path) -> None:
    """A 4 MiB dump through a server taking 1 MiB bodies: rows, priorities, the writer's
    position and the counters come back bit for bit, into the same server and a new one;
    the server keeps nothing staged."""
    server = live_server(max_body_bytes=LIMIT)
    client = ReplayClient(server.url, transport="http")
    client.create_table(big_spec("big"))
    fill(client, "big", 0, 4096 + 904)  # wraps: the writer stands at slot 904
    batch = client.sample("big", 64)
    client.update_priority("big", batch["index"], torch.linspace(0.5, 8.0, 64))
    before = client.info("big")
    path = client.dump("big", tmp_path / "dump")
    size = sum(len(v) for v in files(path).values() if isinstance(v, bytes))
    assert size > 4 * LIMIT, size
    fill(client, "big", 10_000, 700)  # the run goes on; then the dump is loaded back
    client.update_priority("big", batch["index"], torch.ones(64))
    began = time.monotonic()
    info = client.load("big", path)
    print(f"loaded {size} bytes ({size / LIMIT:.1f}x the body limit) in "
          f"{time.monotonic() - began:.2f} s")  # fmt: skip
    for key in ("size", "inserts", "samples", "sampler", "writer"):
        assert info[key] == before[key], key
    assert staged(server) == []
    client.dump("big", tmp_path / "again")
    assert files(tmp_path / "again") == files(path)  # rows, state (priorities, writer)
    other = live_server(max_body_bytes=LIMIT)  # a new server: the table made from the dump
    there = ReplayClient(other.url, transport="http")
    there.load("big", path)
    there.dump("big", tmp_path / "there")
    assert files(tmp_path / "there") == files(path)
    # the dump's archive goes once its answer is sent: the client may have unpacked it first
    deadline = time.monotonic() + 10
    while staged(other) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert staged(other) == []


def test_a_sharded_load_goes_up_in_parts_to_each_server(live_server: Any, tmp_path: Path) -> None:
    """One dump per shard, each over its server's limit, each loaded in parts. Each server
    swaps its table at its own commit: one whose commit fails (another table's dump) keeps
    its table, and no server keeps anything staged."""
    servers = [live_server(max_body_bytes=LIMIT) for _ in range(2)]
    client = ReplayClient([s.url for s in servers], transport="http")
    client.create_table(big_spec("sh"))
    fill(client, "sh", 0, 6000)
    stored = [ReplayClient(s.url, transport="http").export("sh") for s in servers]
    path = client.dump("sh", tmp_path / "dump")
    assert sorted(p.name for p in path.iterdir()) == ["shard-0", "shard-1"]
    fill(client, "sh", 10_000, 1000)
    assert client.load("sh", path)["size"] == 6000
    assert [ReplayClient(s.url, transport="http").export("sh") for s in servers] == stored
    client.create_table(big_spec("other", capacity=2048))
    archives = client.dump_archives("sh")
    archives[1] = client.dump_archives("other")[1]
    fill(client, "sh", 20_000, 1000)
    changed = [ReplayClient(s.url, transport="http").export("sh") for s in servers]
    with pytest.raises(InvalidRequest, match="holds table 'other'"):
        client.load_archives("sh", archives)
    assert [staged(server) for server in servers] == [[], []]
    now = [ReplayClient(s.url, transport="http").export("sh") for s in servers]
    assert now[1] == changed[1] and now[0] == stored[0]  # shard 0's commit went through
    archives[1] = b"not a tar header" * 100  # refused at its first part: shard 0's aborted
    with pytest.raises(CodecError, match="tar header"):
        client.load_archives("sh", archives)
    assert [staged(server) for server in servers] == [[], []]
    assert [ReplayClient(s.url, transport="http").export("sh") for s in servers] == now


def test_the_async_twin_loads_in_parts(live_server: Any, tmp_path: Path) -> None:
    import asyncio

    server = live_server(max_body_bytes=LIMIT)
    sync = ReplayClient(server.url, transport="http")
    sync.create_table(big_spec("abig", capacity=2048))
    fill(sync, "abig", 0, 2048)
    path = sync.dump("abig", tmp_path / "d")
    sync.clear("abig")

    async def main() -> dict[str, Any]:
        async with AsyncReplayClient(server.url, transport="http") as client:
            return await client.load("abig", path)

    assert asyncio.run(main())["size"] == 2048
    assert staged(server) == []


def test_a_failed_load_leaves_the_table_and_no_staging(live_server: Any) -> None:
    """A commit that fails (another table's dump, a damaged or cut archive) ends the upload:
    the table is as it was, nothing stays staged; so does a dump over --max-load-bytes,
    refused at its begin with the flag named."""
    server = live_server(max_body_bytes=LIMIT, max_load_bytes=3 * LIMIT)
    client = ReplayClient(server.url, transport="http")
    for name, n in (("kept", 2048), ("small", 512), ("huge", 4096)):
        client.create_table(big_spec(name, capacity=n))
        fill(client, name, 0, n)
    stored = client.export("kept")
    with pytest.raises(InvalidRequest, match="holds table 'small', not 'kept'"):
        client.load_archives("kept", client.dump_archives("small"))
    archive = client.dump_archives("kept")[0]
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        last = tar.getmembers()[-1].offset  # its header: damaged (tarfile would stop there)
    damaged = archive[:last] + b"\xff" * 512 + archive[last + 512 :]
    for broken, match in ((damaged, "bad checksum"), (archive[: 2 * LIMIT], "ends early")):
        with pytest.raises(CodecError, match=match) as err:
            client.load_archives("kept", [broken])
        assert err.value.status < 500, err.value
    with pytest.raises(PayloadTooLarge, match=r"--max-load-bytes") as big:
        client.load_archives("kept", client.dump_archives("huge"))
    assert big.value.field == "size"
    assert client.export("kept") == stored
    assert staged(server) == []


def _begin(server: Any, table: str, size: int) -> dict[str, Any]:
    status, _, body = server.request(
        "POST", protocol.table_path(table, "load/begin"), json.dumps({"size": size}).encode(),
        {"Content-Type": protocol.JSON},
    )  # fmt: skip
    assert status == 200, body
    return json.loads(body)


def _part(
    server: Any, table: str, upload: str, offset: int, data: bytes, kind: str = protocol.TAR
) -> tuple[int, dict[str, Any]]:
    target = protocol.table_path(table, f"load/part?upload={upload}&offset={offset}")
    status, _, body = server.request("POST", target, data, {"Content-Type": kind})
    return status, json.loads(body)


def _post(server: Any, table: str, action: str, upload: str) -> tuple[int, dict[str, Any]]:
    status, _, body = server.request(
        "POST", protocol.table_path(table, f"load/{action}"),
        json.dumps({"upload": upload}).encode(), {"Content-Type": protocol.JSON},
    )  # fmt: skip
    return status, json.loads(body)


def test_garbage_parts_are_refused_naming_what_is_wrong(live_server: Any) -> None:
    """Each refused part names its fault (and the field), and changes nothing: the upload
    goes on from where it was, and the load it completes restores the table."""
    server = live_server(max_body_bytes=LIMIT)
    client = ReplayClient(server.url, transport="http")
    client.create_table(big_spec("g", capacity=1024))
    fill(client, "g", 0, 1024)
    stored = client.export("g")
    archive = client.dump_archives("g")[0]
    up = _begin(server, "g", len(archive))
    assert up["part_bytes"] == LIMIT and up["received"] == 0 and len(staged(server)) == 1
    uid, first = up["upload"], archive[:LIMIT]
    refused = [
        (_part(server, "g", "0" * 32, 0, first), 400, "upload", "no load '000"),
        (_part(server, "g", "not-an-id", 0, first), 400, "upload", "should match pattern"),
        (_part(server, "g", uid, 0, first, "application/json"), 415, "Content-Type", "x-tar"),
        (_part(server, "g", uid, 0, b""), 400, "body", "empty part"),
        (_part(server, "g", uid, 5, first), 400, "offset", "leaves a gap: 0 bytes are in"),
        (_part(server, "g", uid, 0, b"garbage!" * 128), 400, "archive", "tar header"),
        (_part(server, "g", uid, 0, archive[: LIMIT + 1]), 413, "body", "--max-body-bytes"),
    ]
    client.create_table(big_spec("h", capacity=8))
    refused.append((_part(server, "h", uid, 0, first), 400, "upload", "no load"))  # g's
    for (status, answer), want, field, words in refused:
        assert (status, answer["field"]) == (want, field), answer
        assert words in answer["detail"], answer
    assert _part(server, "g", uid, 0, first) == (200, {**up, "received": LIMIT})
    assert _part(server, "g", uid, 0, first)[1]["received"] == LIMIT  # a retry's repeat
    status, answer = _part(server, "g", uid, 0, b"diff" + first[4:])  # the same, but not
    assert (status, answer["field"]) == (400, "body") and "differs" in answer["detail"]
    status, answer = _part(server, "g", uid, LIMIT - 4, archive[LIMIT - 4 : LIMIT + 4])
    assert (status, answer["field"]) == (400, "offset"), answer  # not the last part
    assert "only the last part, from 0 to" in answer["detail"], answer
    status, answer = _part(server, "g", uid, LIMIT, archive[LIMIT:] + b"x" * 8)
    assert (status, answer["field"]) == (400, "offset") and "past the" in answer["detail"]
    status, answer = _post(server, "g", "commit", uid)  # not whole: refused, the upload stays
    assert status == 400 and f"{LIMIT} of its {len(archive)} bytes" in answer["detail"]
    for offset in range(LIMIT, len(archive), LIMIT):
        assert _part(server, "g", uid, offset, archive[offset : offset + LIMIT])[0] == 200
    client.extend("g", {"id": torch.arange(5), "observation": torch.zeros(5, ROW)})
    status, info = _post(server, "g", "commit", uid)
    assert (status, info["inserts"]) == (200, 1024)
    assert client.export("g") == stored
    assert staged(server) == []
    assert _post(server, "g", "commit", uid)[0] == 400  # ended
    assert _post(server, "g", "abort", uid) == (200, {"aborted": False})


def test_begin_refuses_what_cannot_be_staged(live_server: Any) -> None:
    server = live_server(max_body_bytes=LIMIT, max_load_bytes=8 * LIMIT)
    for size, want, words in (
        (0, 400, "greater than or equal to 1"),
        ("12", 400, "valid integer"),
        (8 * LIMIT + 1, 413, "--max-load-bytes"),
        (1 << 62, 413, "--max-load-bytes"),
    ):
        status, _, body = server.request(
            "POST", protocol.table_path("t", "load/begin"), json.dumps({"size": size}).encode(),
            {"Content-Type": protocol.JSON},
        )  # fmt: skip
        answer = json.loads(body)
        assert (status, answer["field"]) == (want, "size") and words in answer["detail"], answer
    uploads = [_begin(server, "t", LIMIT)["upload"] for _ in range(17)]  # 16 at most:
    assert len(staged(server)) == 16  # the 17th dropped the one idle longest
    assert _post(server, "t", "abort", uploads[0]) == (200, {"aborted": False})
    for uid in uploads[1:]:
        assert _post(server, "t", "abort", uid) == (200, {"aborted": True})
    assert staged(server) == []


def _send_slowly(server: Any, target: str, body: bytes, *, pieces: int, pause: float,
                 cut: bool = False) -> bytes:  # fmt: skip
    """POST ``body`` in ``pieces`` with ``pause`` s between them (``cut``: hang up before
    the last); the raw answer."""
    head = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {protocol.TAR}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    step = -(-len(body) // pieces)
    with socket.create_connection((server.host, server.port), timeout=30) as conn:
        conn.sendall(head)
        for i in range(0, len(body), step):
            if cut and i + step >= len(body):
                return b""
            conn.sendall(body[i : i + step])
            time.sleep(pause)
        return conn.recv(1 << 16)


def test_a_cut_off_upload_leaves_the_table_and_is_cleaned(live_server: Any) -> None:
    """A part cut off mid-body counts nothing; a part received slowly is not expired while
    it arrives; an upload left idle past --load-timeout (its client gone) is dropped with
    its staged bytes, and the table never changed."""
    server = live_server(max_body_bytes=LIMIT, load_timeout=1.0)
    client = ReplayClient(server.url, transport="http")
    client.create_table(big_spec("c", capacity=2048))
    fill(client, "c", 0, 2048)
    stored = client.export("c")
    archive = client.dump_archives("c")[0]
    uid = _begin(server, "c", len(archive))["upload"]
    target = protocol.table_path("c", f"load/part?upload={uid}&offset=0")
    _send_slowly(server, target, archive[:LIMIT], pieces=4, pause=0.1, cut=True)
    status, answer = _part(server, "c", uid, 1, b"x")  # what is in: the gap's error says
    assert status == 400 and "0 bytes are in" in answer["detail"], answer
    slow = _send_slowly(server, target, archive[:LIMIT], pieces=6, pause=0.3)  # 1.8 s > 1 s
    assert slow.startswith(b"HTTP/1.1 200") and f'"received":{LIMIT}'.encode() in slow, slow
    assert len(staged(server)) == 1
    deadline = time.monotonic() + 10
    while staged(server) and time.monotonic() < deadline:  # idle: dropped after 1 s
        time.sleep(0.1)
    assert staged(server) == []
    status, answer = _part(server, "c", uid, LIMIT, archive[LIMIT : 2 * LIMIT])
    assert (status, answer["field"]) == (400, "upload") and "--load-timeout" in answer["detail"]
    assert client.export("c") == stored
    assert client.info("c")["inserts"] == 2048


def test_an_upload_dropped_while_the_disk_refuses_writes_is_deleted(live_server: Any) -> None:
    """An upload dropped while the disk refuses writes (full, or here over the process's
    file size limit) goes with its folder all the same, and its abort is answered: closing
    the member half written cannot write its last bytes, and must not keep the folder (a
    full disk is when its bytes are wanted back most)."""
    import resource

    server = live_server(max_body_bytes=LIMIT)
    info = tarfile.TarInfo("a.bin")
    info.size = 4096
    archive = info.tobuf(tarfile.PAX_FORMAT) + b"x" * 4096 + b"\0" * 1024
    uid = _begin(server, "t", len(archive))["upload"]
    assert _part(server, "t", uid, 0, archive[: 512 + 100])[0] == 200  # a.bin's first bytes
    limit = resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (50, limit[1]))
    try:
        answer = _post(server, "t", "abort", uid)
    finally:
        resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, limit)
    assert answer == (200, {"aborted": True})
    assert staged(server) == []


def test_a_part_the_archive_reader_refuses_ends_the_upload_and_says_so(live_server: Any) -> None:
    """A part whose member the reader refuses (here: a link) is a 400 naming it, and ends
    the upload: the next part's 400 says a part was refused, not only commits, aborts and
    idling, so its client knows why it must begin again; nothing stays staged."""
    server = live_server(max_body_bytes=LIMIT)
    link = tarfile.TarInfo("l")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    archive = link.tobuf(tarfile.PAX_FORMAT) + b"\0" * 1024
    uid = _begin(server, "t", len(archive))["upload"]
    status, answer = _part(server, "t", uid, 0, archive[:512])
    assert (status, answer["field"]) == (400, "archive") and "'l'" in answer["detail"], answer
    assert staged(server) == []
    status, answer = _part(server, "t", uid, 512, archive[512:])
    assert (status, answer["field"]) == (400, "upload"), answer
    assert "refused" in answer["detail"], answer
