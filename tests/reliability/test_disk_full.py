"""A full disk under a real ``tdreplay serve``: 507 and a message, never SIGBUS, nothing left behind.

The data root is a small tmpfs mounted by the test (``mount -t tmpfs``, which
needs root or CAP_SYS_ADMIN: skipped with the reason where it is refused).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from service_helpers import ARROW
from tensordict import TensorDict
from testkit import small_tmpfs

from tdreplay.codec import decode, encode, protocol

SIZE_MB = 8
FIELDS = {"x": {"shape": [1024], "dtype": "float32"}}  # 4 KiB an item


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk", SIZE_MB) as mnt:
        yield mnt


def spec(name: str, capacity: int, backend: str) -> bytes:
    return json.dumps(
        {"name": name, "capacity": capacity, "fields": FIELDS, "backend": {"kind": backend}}
    ).encode()


def post(server: Any, path: str, payload: Any, **kw: Any) -> tuple[int, dict[str, Any]]:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = kw.pop("headers", {"Content-Type": "application/json"})
    status, _, raw = server.request("POST", path, body=data, headers=headers, **kw)
    return status, json.loads(raw) if raw and raw[:1] == b"{" else {}


def fill(mnt: Path, leave: int) -> Path:
    """A file taking all but ``leave`` bytes of the disk."""
    filler = mnt / "filler"
    free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, max(free - leave, 1))
    finally:
        os.close(fd)
    return filler


def tree(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def serve(live_server: Callable[..., Any], mnt: Path) -> Any:
    return live_server(root=mnt / "data")


@pytest.mark.parametrize(
    ("backend", "how"), [("memmap", "schema"), ("memmap", "flag"), ("h5", "schema")]
)
def test_a_table_larger_than_the_disk_is_refused_with_507_when_its_capacity_is_reserved(
    live_server: Callable[..., Any], small_disk: Path, backend: str, how: str
) -> None:
    """``preallocate`` (the schema's or the server's ``--preallocate``) reserves the whole
    capacity at create: a table larger than the disk is refused."""
    flags = ["--preallocate"] if how == "flag" else []
    server = live_server(*flags, root=small_disk / "data")
    capacity = 2 * SIZE_MB * 256  # 2x the disk
    body = json.loads(spec("big", capacity, backend))
    if how == "schema":
        body["backend"]["preallocate"] = True
    status, err = post(server, protocol.TABLES, body)
    assert (status, err.get("type")) == (507, "InsufficientStorage"), err
    assert "bytes" in err["detail"] and "free" in err["detail"], err["detail"]
    assert not (server.root / "tables" / "big").exists()
    assert os.statvfs(small_disk).f_bfree / os.statvfs(small_disk).f_blocks > 0.9
    # the server lives on and creates what fits
    status, err = post(server, protocol.TABLES, spec("small", 64, backend))
    assert status == 201, err
    assert server.request("GET", "/healthz")[0] == 200


def items(start: int, n: int) -> bytes:
    ids = torch.arange(start, start + n, dtype=torch.float32)
    return encode(TensorDict({"x": ids[:, None].expand(n, 1024).contiguous()}, [n])).to_pybytes()


def extend(server: Any, name: str, start: int, n: int) -> tuple[int, dict[str, Any]]:
    return post(server, protocol.table_path(name, "extend"), items(start, n), headers=ARROW)


def sampled(server: Any, name: str, n: int = 64) -> torch.Tensor:
    status, _, raw = server.request(
        "POST", protocol.table_path(name, "sample") + f"?batch_size={n}"
    )
    assert status == 200, raw[:300]
    x = decode(raw)["x"]
    assert torch.equal(x, x[:, :1].expand_as(x)), "a row mixes two items"  # no torn rows
    return x[:, 0].long()


def used(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_disk_follows_the_rows_and_a_full_disk_is_a_507_before_any_row_lands(
    live_server: Callable[..., Any], small_disk: Path
) -> None:
    """A memmap table 4x the disk is created with next to nothing on it, takes rows until
    the disk is full - then answers 507 with no row landed and keeps serving every
    acknowledged row, before and after a restart on the full disk - and takes more once
    there is room again. Never SIGBUS."""
    server = serve(live_server, small_disk)
    capacity = 4 * SIZE_MB * 256  # 4 KiB items: 32 MiB of rows on an 8 MiB disk
    assert post(server, protocol.TABLES, spec("big", capacity, "memmap"))[0] == 201
    assert used(small_disk) < 1 << 20  # bookkeeping only
    info = json.loads(server.request("GET", protocol.table_path("big"))[2])
    assert info["stats"]["reserved_bytes"] < 1 << 16  # tensordict touches the first page
    # rows, and the per-slot state files (live 1, times sampled 8, ordinal 8, tag 8) with them
    assert info["stats"]["capacity_bytes"] == capacity * (4096 + 25)
    filler = fill(small_disk, leave=5 << 20)  # others' files: 5 MiB left for the table
    acked = 0
    while True:
        status, err = extend(server, "big", acked, 64)
        if status != 200:
            break
        acked += 64
    assert (status, err.get("type")) == (507, "InsufficientStorage"), err
    assert "no room for more rows" in err["detail"] and "keeps serving" in err["detail"]
    assert 3 << 8 <= acked <= 5 << 8  # the 5 MiB filled (3-5 MiB of 4 KiB rows), no more
    got = json.loads(server.request("GET", protocol.table_path("big"))[2])
    assert got["size"] == acked and got["inserts"] == acked  # nothing of the 507 landed
    assert acked * 4096 <= got["stats"]["reserved_bytes"] <= used(small_disk)
    assert int(sampled(server, "big").max()) < acked
    # a restart on the full disk: every acknowledged row is back, the disk is still full
    server.stop()
    server = serve(live_server, small_disk)
    got = json.loads(server.request("GET", protocol.table_path("big"))[2])
    assert got["size"] == acked
    ids = sampled(server, "big", 256)
    assert int(ids.max()) < acked and int(ids.min()) >= 0
    assert extend(server, "big", acked, 64)[1].get("type") == "InsufficientStorage"
    # room again: rows go on from where they stopped
    filler.unlink()
    for start in range(acked, acked + 256, 64):
        status, err = extend(server, "big", start, 64)
        assert status == 200, err
    got = json.loads(server.request("GET", protocol.table_path("big"))[2])
    assert got["size"] == acked + 256
    assert server.proc.poll() is None  # never a SIGBUS


def test_an_h5_table_grows_with_its_rows_and_a_full_disk_is_a_507(
    live_server: Callable[..., Any], small_disk: Path
) -> None:
    """An h5 table's file is sparse too: created 4x the disk, it takes rows until the disk is
    full, then answers 507 with nothing landed and serves what it holds."""
    server = serve(live_server, small_disk)
    capacity = 4 * SIZE_MB * 256
    assert post(server, protocol.TABLES, spec("h", capacity, "h5"))[0] == 201
    assert used(small_disk) < 1 << 20
    acked = 0
    while True:
        status, err = extend(server, "h", acked, 64)
        if status != 200:
            break
        acked += 64
    assert (status, err.get("type")) == (507, "InsufficientStorage"), err
    assert 3 << 9 <= acked <= 2 << 10  # most of the 8 MiB disk, not more
    got = json.loads(server.request("GET", protocol.table_path("h"))[2])
    assert got["size"] == got["inserts"] == acked
    assert int(sampled(server, "h", 256).max()) < acked
    assert server.proc.poll() is None


def test_a_table_that_wrapped_needs_no_more_disk(
    live_server: Callable[..., Any], small_disk: Path
) -> None:
    """Once a table holds its capacity, new rows reuse its slots: a full disk changes nothing."""
    server = serve(live_server, small_disk)
    capacity = 256  # 1 MiB of rows
    assert post(server, protocol.TABLES, spec("ring", capacity, "memmap"))[0] == 201
    for start in range(0, capacity, 64):
        assert extend(server, "ring", start, 64)[0] == 200
    fill(small_disk, leave=0)
    for start in range(capacity, 3 * capacity, 64):  # twice round the ring on a full disk
        status, err = extend(server, "ring", start, 64)
        assert status == 200, err
    ids = sampled(server, "ring", 256)
    assert int(ids.min()) >= 2 * capacity  # the newest round only
    assert server.proc.poll() is None


def test_a_checkpoint_or_export_on_a_full_disk_answers_507_and_keeps_the_previous(
    live_server: Callable[..., Any], small_disk: Path
) -> None:
    server = serve(live_server, small_disk)
    assert post(server, protocol.TABLES, spec("t", 256, "memory"))[0] == 201
    rows = TensorDict({"x": torch.arange(256 * 1024, dtype=torch.float32).view(256, 1024)}, [256])
    status, _ = post(
        server, protocol.table_path("t", "extend"), encode(rows).to_pybytes(), headers=ARROW
    )
    assert status == 200
    status, err = post(server, protocol.table_path("t", "checkpoint"), {})
    assert status == 200, err
    checkpoints = server.root / protocol.CHECKPOINTS
    before = tree(checkpoints / "t")

    status, _, _ = server.request("POST", protocol.table_path("t", "sample") + "?batch_size=8")
    assert status == 200  # a change (its counters): the next checkpoint is written, not skipped
    filler = fill(small_disk, leave=256 * 1024)  # a quarter of what a checkpoint needs
    status, err = post(server, protocol.table_path("t", "checkpoint"), {})
    assert (status, err.get("type")) == (507, "InsufficientStorage"), err
    assert "no space" in err["detail"].lower()
    assert tree(checkpoints / "t") == before  # the previous checkpoint is intact
    assert sorted(p.name for p in checkpoints.iterdir()) == ["t"]  # no .tmp-* left

    status, err = post(
        server, protocol.table_path("t", "export"), {"format": "csv", "path": "exports/t.csv"}
    )
    assert (status, err.get("type")) == (507, "InsufficientStorage"), err
    assert not [p for p in (server.root / "exports").rglob("*") if p.is_file()]

    status, _, raw = server.request("POST", protocol.table_path("t", "sample") + "?batch_size=8")
    assert status == 200 and decode(raw)["x"].shape == (8, 1024)  # still serving

    filler.unlink()
    assert post(server, protocol.table_path("t", "checkpoint"), {})[0] == 200


@pytest.mark.parametrize("rows", [0, 64])
@pytest.mark.parametrize("action", ["dump", "checkpoint"])
def test_a_dump_or_checkpoint_of_a_memmap_table_on_a_full_disk_is_a_507_not_a_sigbus(
    live_server: Callable[..., Any], small_disk: Path, action: str, rows: int
) -> None:
    """A memmap table's per-slot state files are holes past its reserved rows; a snapshot
    read them whole, and a tmpfs backs a hole's page when it is read: on a full one the
    server died of SIGBUS (exit 135). Now the state is read over the written slots only,
    and the call answers 507 naming the table, leaves nothing behind, and the server serves on."""
    server = serve(live_server, small_disk)
    assert post(server, protocol.TABLES, spec("big", 4096, "memmap"))[0] == 201
    if rows:
        assert extend(server, "big", 0, rows)[0] == 200
    filler = fill(small_disk, leave=0)
    status, err = post(server, protocol.table_path("big", action), {})
    assert server.proc.poll() is None, "the server died"
    assert (status, err.get("type")) == (507, "InsufficientStorage"), err
    assert "'big'" in err["detail"], err["detail"]
    scratch = [server.root / ".transfers", server.root / protocol.CHECKPOINTS]
    assert not [p for folder in scratch if folder.exists() for p in folder.rglob("*")]
    status, _, raw = server.request("GET", protocol.table_path("big"))
    assert status == 200 and json.loads(raw)["size"] == rows  # still serving
    filler.unlink()
    assert post(server, protocol.table_path("big", action), {})[0] == 200
    assert server.request("GET", "/healthz")[0] == 200


@pytest.mark.parametrize("leave", [0, 256 << 10, 700 << 10, 4 << 20])
def test_a_load_on_a_nearly_full_disk_lands_or_is_a_507_never_a_sigbus(
    live_server: Callable[..., Any], small_disk: Path, leave: int
) -> None:
    """A load builds the table beside the served one: its rows written, its per-slot state
    loaded into new state files (holes past its rows), then swapped in, which reads the
    idempotency tags. Loading and that read touched every slot's page, and a tmpfs backs a
    hole's page when it is touched: with ~700 KB left the server died of SIGBUS (exit 135).
    Now both go over the written slots only: the load lands or answers 507, and the table
    serves on either way."""
    server = serve(live_server, small_disk)
    assert post(server, protocol.TABLES, spec("big", 4096, "memmap"))[0] == 201
    assert extend(server, "big", 0, 64)[0] == 200
    status, _, dump = server.request("POST", protocol.table_path("big", "dump"), body=b"{}")
    assert status == 200
    filler = fill(small_disk, leave=leave)
    status, err = post(
        server, protocol.table_path("big", "load"), dump, headers={"Content-Type": protocol.TAR}
    )
    assert server.proc.poll() is None, "the server died"
    assert status in (200, 507), (status, err, server.log.read_text()[-3000:])
    status, _, raw = server.request("GET", protocol.table_path("big"))
    assert status == 200 and json.loads(raw)["size"] == 64
    assert set(sampled(server, "big").tolist()) <= set(range(64))  # its rows, served
    filler.unlink()
    assert post(server, protocol.table_path("big", "checkpoint"), {})[0] == 200
