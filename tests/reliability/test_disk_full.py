"""A full disk under a real ``tdreplay serve``: 507 and a message, never SIGBUS, nothing left behind.

The data root is a small tmpfs mounted by the test (``mount -t tmpfs``, which
needs root or CAP_SYS_ADMIN: skipped with the reason where it is refused).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from service_helpers import ARROW
from tensordict import TensorDict

from tdreplay.codec import decode, encode, protocol

SIZE_MB = 8
FIELDS = {"x": {"shape": [1024], "dtype": "float32"}}  # 4 KiB an item


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}M", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        # lazy: the server (stopped by live_server at the module's end) may still hold files
        subprocess.run(["umount", "-l", str(mnt)], check=False)


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


@pytest.mark.parametrize("backend", ["memmap", "h5"])
def test_a_table_larger_than_the_disk_is_refused_with_507_and_leaves_nothing(
    live_server: Callable[..., Any], small_disk: Path, backend: str
) -> None:
    server = serve(live_server, small_disk)
    capacity = 2 * SIZE_MB * 256  # 2x the disk
    status, err = post(server, protocol.TABLES, spec("big", capacity, backend))
    assert (status, err.get("type")) == (507, "InsufficientStorage"), err
    assert "bytes" in err["detail"] and "free" in err["detail"], err["detail"]
    assert not (server.root / "tables" / "big").exists()
    assert os.statvfs(small_disk).f_bfree / os.statvfs(small_disk).f_blocks > 0.9
    # the server lives on and creates what fits
    status, err = post(server, protocol.TABLES, spec("small", 64, backend))
    assert status == 201, err
    assert server.request("GET", "/healthz")[0] == 200


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
