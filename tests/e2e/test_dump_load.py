"""A table's whole state to the caller's disk and back (dump / load), against real servers;
and a load's archive treated as what it is: untrusted bytes from the network."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from test_shm import spec, wait_until
from testkit import PEAK, rows

from tdreplay.client import (
    AsyncReplayClient,
    CodecError,
    InvalidRequest,
    ReplayClient,
    TableNotFound,
)
from tdreplay.codec import protocol
from tdreplay.codec.archive import Packed


def _scratch(server: Any) -> list[Path]:
    return (
        sorted((server.root / ".transfers").glob("*"))
        if (server.root / ".transfers").exists()
        else []
    )


def test_dump_and_load_round_trip_the_whole_table(live_server: Any, tmp_path: Path) -> None:
    """Rows, priorities, counters and the sampler come back bit for bit, into the same
    server or another one (a restart on a new machine), and the server keeps nothing."""
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("dl", {"kind": "prioritized"}, capacity=32))
    client.extend("dl", rows(0, 20))
    client.extend("dl", rows(20, 20))  # wraps: slots hold items 8..39
    batch = client.sample("dl", 8)
    client.update_priority("dl", batch["index"], torch.linspace(0.5, 4.0, 8))
    before, stored = client.info("dl"), client.export("dl")
    path = client.dump("dl", tmp_path / "dump")
    assert path == tmp_path / "dump" and (path / "metadata.json").is_file()
    wait_until(lambda: _scratch(server) == [])  # the server's copy goes once it is sent
    client.extend("dl", rows(40, 8))
    info = client.load("dl", path)
    assert info["inserts"] == before["inserts"] == 40
    assert client.export("dl") == stored
    other = live_server()  # another server: the table is created from the dump
    there = ReplayClient(other.url, transport="http")
    with pytest.raises(TableNotFound):
        there.info("dl")
    there.load("dl", path)
    after = there.info("dl")
    for key in ("size", "inserts", "samples", "capacity", "sampler"):
        assert after[key] == before[key], key
    assert there.export("dl") == stored
    with pytest.raises(FileExistsError, match="not empty"):
        client.dump("dl", path)  # never over an earlier dump
    with pytest.raises(FileNotFoundError, match="no table dump"):
        client.load("dl", tmp_path / "nothing-here")


def test_the_async_twin_dumps_and_loads(live_server: Any, tmp_path: Path) -> None:
    import asyncio

    server = live_server()
    ReplayClient(server.url).create_table(spec("adl", {"kind": "uniform"}, capacity=16))

    async def main() -> None:
        async with AsyncReplayClient(server.url) as client:
            await client.extend("adl", rows(0, 10))
            await client.dump("adl", tmp_path / "d")
            await client.extend("adl", rows(10, 5))
            assert (await client.load("adl", tmp_path / "d"))["size"] == 10

    asyncio.run(main())


def _archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


def test_a_loaded_archive_is_untrusted(live_server: Any, tmp_path: Path) -> None:
    """A member leaving the scratch folder, a link, a device, a damaged or oversized archive,
    or another table's dump: refused with the member or the limit named; nothing is
    written outside the server's scratch folder, which is emptied, and the table is
    untouched."""
    server = live_server(max_body_bytes=1 << 20)
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("ul", {"kind": "uniform"}, capacity=16))
    client.extend("ul", rows(0, 16))
    stored = client.export("ul")
    path = server.root.parent / "escaped"
    for archive, match in [
        (_archive((_member("../escaped"), b"x")), "leaves the destination"),
        (_archive((_member(str(path)), b"x")), "leaves the destination"),
        (_archive((_member("link", tarfile.SYMTYPE, "/etc/passwd"), b"")), "not a regular"),
        (_archive((_member("hard", tarfile.LNKTYPE, "metadata.json"), b"")), "not a regular"),
        (_archive((_member("dev", tarfile.CHRTYPE), b"")), "not a regular"),
        (b"not a tar archive at all" * 10, "not a whole tar archive"),
        (
            _archive((_member("big"), b"\0" * (900 << 10)), (_member("big2"), b"\0" * (200 << 10))),
            None,
        ),
        (_archive((_member("metadata.json"), b"{}")), None),
    ]:
        status, _, body = server.request(
            "POST", protocol.table_path("ul", "load"), archive, {"Content-Type": protocol.TAR}
        )
        assert 400 <= status < 500, (status, body[:200])
        if match is not None:
            assert match.encode() in body, body[:300]
        assert not path.exists()
        assert _scratch(server) == []
        assert client.export("ul") == stored
    status, _, body = server.request(
        "POST", protocol.table_path("ul", "load"), b"x", {"Content-Type": "application/zip"}
    )
    assert status == 415
    with pytest.raises(CodecError, match="does not begin with a tar header"):
        client.load_archives("ul", [b"\0" * (2 << 20)])  # over the body limit: in parts
    assert _scratch(server) == []
    with pytest.raises(CodecError):
        client.load_archives("ul", [b"\0" * 100])
    # another table's dump
    client.create_table(spec("ul2", {"kind": "uniform"}, capacity=16))
    with pytest.raises(InvalidRequest, match="holds table 'ul2'"):
        client.load_archives("ul", client.dump_archives("ul2"))
    assert client.export("ul") == stored


def test_a_restart_empties_the_scratch_folders(live_server: Any) -> None:
    server = live_server()
    for name in (".transfers", ".exports"):
        (server.root / name / "left-by-a-crash").mkdir(parents=True)
    server.stop()
    again = live_server(root=server.root)
    assert ReplayClient(again.url).health()["status"] == "ok"
    assert not any((server.root / ".transfers").glob("*"))
    assert not any((server.root / ".exports").glob("*"))


#: a client process that dumps a table into a folder and loads it back, and prints how
#: much its peak resident memory grew over each (after a warm-up dump and load of 1 row)
_MEASURED = (
    PEAK
    + """
import sys
from pathlib import Path
from tdreplay.client import ReplayClient

url, big, small, out = sys.argv[1:]
client = ReplayClient(url, transport="http")
client.load(small, client.dump(small, Path(out) / "warm"))
base = reset_peak()
client.dump(big, Path(out) / "big")
dumped = peak_growth(base)
base = reset_peak()
client.load(big, Path(out) / "big")
print(dumped, peak_growth(base))
"""
)


def _disk(folder: Path) -> int:
    """Bytes the files under ``folder`` hold on disk now (files and folders going as it
    walks: skipped)."""
    total = 0
    for top, dirs, names in os.walk(folder):
        for name in dirs + names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def test_a_dump_and_a_load_hold_a_part_not_the_table(live_server: Any, tmp_path: Path) -> None:
    """A dump unpacks each archive as it arrives, and a load reads the dump's files a part
    at a time: a client dumping and loading a table of ~190 MB grows its peak memory by a
    few parts (8 MB each under this server's body limit), not by the table, and its disk
    holds the dump's files once (never the archive beside them); so does the server's, the
    load going up in parts (it unpacks each part as it comes)."""
    import subprocess
    import sys
    import threading

    server = live_server(max_body_bytes=8 << 20)
    client = ReplayClient(server.url, transport="http")
    big = {"frames": {"shape": [96, 96, 3], "dtype": "uint8"}, "n": {"shape": [], "dtype": "int64"}}
    for name, capacity in (("big", 7000), ("small", 4)):
        client.create_table(
            {"name": name, "capacity": capacity, "fields": big, "backend": {"kind": "memory"}}
        )
    for start in range(0, 7000, 250):
        n = torch.arange(start, start + 250)
        frames = (n % 251).to(torch.uint8)[:, None, None, None].expand(250, 96, 96, 3)
        client.extend("big", {("frames",): frames.contiguous(), ("n",): n})
    client.extend("small", {("frames",): torch.zeros(1, 96, 96, 3, dtype=torch.uint8),
                            ("n",): torch.zeros(1, dtype=torch.int64)})  # fmt: skip
    before = client.export("big")
    peak_disk, peak_staged, stop = [0], [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak_disk[0] = max(peak_disk[0], _disk(tmp_path))
            peak_staged[0] = max(peak_staged[0], _disk(server.root / ".transfers"))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _MEASURED, server.url, "big", "small", str(tmp_path)],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
    finally:
        stop.set()
        watcher.join()
    dump_growth, load_growth = (int(v) for v in done.stdout.split())
    table_bytes = 7000 * (96 * 96 * 3 + 8)
    assert table_bytes > 190e6
    assert dump_growth < 64 << 20, (dump_growth, done.stderr)
    assert load_growth < 64 << 20, (load_growth, done.stderr)
    dumped = _disk(tmp_path)
    assert dumped > table_bytes and peak_disk[0] < dumped + (16 << 20), (peak_disk, dumped)
    assert table_bytes < peak_staged[0] < dumped + (16 << 20), (peak_staged, dumped)
    assert client.export("big") == before  # and the table came back whole
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_dump_and_a_load_show_their_bytes_when_asked(
    live_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``progress=True``: a bar of the bytes received (dump) and sent (load) on stderr,
    ending at the archive's size; by default (stderr not a terminal) none."""
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("pb", {"kind": "uniform"}, capacity=64))
    client.extend("pb", rows(0, 64))
    client.dump("pb", tmp_path / "quiet")
    client.load("pb", tmp_path / "quiet")
    assert capsys.readouterr().err == ""
    client.dump("pb", tmp_path / "shown", progress=True)
    client.load("pb", tmp_path / "shown", progress=True)
    err = capsys.readouterr().err
    size = len(Packed(tmp_path / "shown"))
    assert "dump pb" in err and "load pb" in err and "100%" in err, err
    assert f"{size / 1000:.1f}k" in err or f"{size}" in err, (size, err)


def test_a_dump_the_client_leaves_midway_leaves_nothing_on_the_server(live_server: Any) -> None:
    """The server streams a dump from its checkpoint's files: a client that hangs up after
    the first bytes leaves no scratch folder behind, and the next dump is whole."""
    import socket

    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(
        {"name": "d", "capacity": 4096, "fields": {"x": {"shape": [1024], "dtype": "float32"}}}
    )
    client.extend("d", {("x",): torch.rand(4096, 1024)})
    target = protocol.table_path("d", "dump")
    for _ in range(3):
        with socket.create_connection((server.host, server.port), timeout=30) as conn:
            conn.sendall(
                f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n".encode()
            )
            head = conn.recv(1 << 16)
            assert head.startswith(b"HTTP/1.1 200") and b"content-length: " in head.lower(), head
    scratch = server.root / ".transfers"
    wait_until(lambda: not scratch.exists() or not list(scratch.iterdir()))
    archive = client.dump_archives("d")[0]
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert sum(m.size for m in tar.getmembers()) > 16 << 20
    assert list(scratch.iterdir()) == []


def test_a_dump_that_fails_midway_leaves_nothing_on_the_server(live_server: Any) -> None:
    """A dump whose files cannot be read on (here: one cut short under it while its answer
    is on the way) ends its answer early, and its scratch folder goes all the same."""
    import socket

    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(
        {"name": "f", "capacity": 4096, "fields": {"x": {"shape": [2048], "dtype": "float32"}}}
    )
    client.extend("f", {("x",): torch.rand(4096, 2048)})  # 32 MiB: far past socket buffers
    target = protocol.table_path("f", "dump")
    with socket.socket() as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        conn.settimeout(30)
        conn.connect((server.host, server.port))
        conn.sendall(
            f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n".encode()
        )
        head = conn.recv(1 << 16)
        assert head.startswith(b"HTTP/1.1 200"), head
        (folder,) = _scratch(server)
        biggest = max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        os.truncate(biggest, 0)
        got = len(head)
        while chunk := conn.recv(1 << 20):
            got += len(chunk)
    assert got < 32 << 20  # cut short: the answer ended early
    wait_until(lambda: not _scratch(server), timeout=10)
    assert _scratch(server) == []
