"""No answer of a real server names where its files are: the data root's absolute path (nor the
folder above it) never reaches a client, over HTTP or the same-host socket.

Every case makes a real error happen on real files (a damaged or missing checkpoint, a
damaged archive loaded at once or in parts, a table folder tdreplay did not make, a table
damaged while the server was stopped, a full disk under a checkpoint, an export, a dump, an
extend and a clear) or reads what a client may read (info, listing, status, metrics), and
greps each answer for the root. Answers name the server's files relative to the data root
(``<root>/checkpoints/x``, ``tables/t/storage``); the server's log keeps the full paths.
The full disk is a small tmpfs (``mount``, root only: those cases skip elsewhere).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import testkit
import torch
from tensordict import TensorDict

from tdreplay.client import ReplayClient, ServerError
from tdreplay.codec import encode, protocol

JSON = {"Content-Type": protocol.JSON}
ARROW = {"Content-Type": protocol.ARROW_STREAM}
TAR = {"Content-Type": protocol.TAR}
BIG = {"x": {"shape": [1024], "dtype": "float32"}}  # 4 KiB an item
DISK_MB = 24


def spec(name: str, fields: dict[str, Any], capacity: int, kind: str = "memmap") -> bytes:
    body = {"name": name, "capacity": capacity, "fields": fields, "backend": {"kind": kind}}
    return json.dumps(body).encode()


def big_rows(start: int, n: int) -> bytes:
    ids = torch.arange(start, start + n, dtype=torch.float32)
    return encode(TensorDict({"x": ids[:, None].expand(n, 1024).contiguous()}, [n])).to_pybytes()


@pytest.fixture(scope="module")
def env(live_server: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server whose root is on a small tmpfs (a plain folder where mounting is refused), with
    table ``t`` (memmap, 16 rows, checkpointed), ``big`` (4 KiB items), damaged copies of
    ``t``'s checkpoint, and ``broken``, a table damaged while the server was stopped."""
    base = tmp_path_factory.mktemp("answers")
    disk = base / "disk"
    disk.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}M", "tmpfs", str(disk)],
            capture_output=True,
        ).returncode
        == 0
    )
    root = disk / "data"
    first = live_server(root=root)
    assert (
        first.request("POST", protocol.TABLES, spec("broken", testkit.FIELDS, 16), JSON)[0] == 201
    )
    first.stop()
    for state in (root / "tables" / "broken").rglob("*.json"):
        if not state.name.startswith(".tdreplay"):
            state.write_text("{damaged")
    server = live_server(root=root)
    for body in (spec("t", testkit.FIELDS, 16), spec("big", BIG, 4096)):
        assert server.request("POST", protocol.TABLES, body, JSON)[0] == 201
    data = encode(testkit.rows(0, 16)).to_pybytes()
    assert server.request("POST", protocol.table_path("t", "extend"), data, ARROW)[0] == 200
    assert server.request("POST", protocol.table_path("t", "checkpoint"))[0] == 200
    checkpoints = root / protocol.CHECKPOINTS
    shutil.copytree(checkpoints / "t", checkpoints / "bad" / "meta")
    (checkpoints / "bad" / "meta" / "metadata.json").write_text("{not json")
    shutil.copytree(checkpoints / "t", checkpoints / "bad" / "gone")
    files = sorted(p for p in (checkpoints / "bad" / "gone").rglob("*") if p.is_file())
    [p.unlink() for p in files if p.name != "metadata.json"][:1]
    (root / "tables" / "alien").mkdir(parents=True)
    (root / "tables" / "alien" / "notes.txt").write_text("not tdreplay's")
    yield {"server": server, "root": root, "disk": disk if mounted else None}
    server.stop()
    if mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@contextmanager
def full_disk(env: dict[str, Any], leave: int = 256 << 10) -> Iterator[None]:
    """The root's disk full but for ``leave`` bytes (a tmpfs; skipped where none is mounted)."""
    disk = env["disk"]
    if disk is None:
        pytest.skip("no tmpfs could be mounted here (needs root)")
    filler = disk / "filler"
    st = os.statvfs(disk)
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, max(st.f_bavail * st.f_frsize - leave, 1))
    finally:
        os.close(fd)
    try:
        yield
    finally:
        filler.unlink()


def on_full_disk(env: dict[str, Any], call: Callable[[], bytes], leave: int = 0) -> list[bytes]:
    with full_disk(env, leave):
        return [call()]


def http(env: dict[str, Any], method: str, path: str, body: Any = None, **kw: Any) -> bytes:
    headers = kw.pop("headers", JSON)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    status, _, raw = env["server"].request(method, path, data, headers)
    want = kw.get("status")
    assert want is None or status == want, (status, raw[:500])
    return raw


def post(env: dict[str, Any], table: str, action: str, body: Any = None, **kw: Any) -> bytes:
    return http(env, "POST", protocol.table_path(table, action), body, **kw)


def archive(env: dict[str, Any], damaged: bool) -> bytes:
    """``t``'s dump, its metadata replaced by garbage if ``damaged``."""
    raw = post(env, "t", "dump", status=200)
    if not damaged:
        return raw
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
            if member.name.endswith("metadata.json"):
                data, member.size = b"{not json", 9
            dst.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return out.getvalue()


def load_in_parts(env: dict[str, Any], body: bytes, status: int) -> list[bytes]:
    begun = post(env, "t", "load/begin", {"size": len(body)}, status=200)
    upload = json.loads(begun)["upload"]
    part = post(env, "t", f"load/part?upload={upload}&offset=0", body, headers=TAR, status=200)
    return [begun, part, post(env, "t", "load/commit", {"upload": upload}, status=status)]


def listing(env: dict[str, Any]) -> bytes:
    raw = http(env, "GET", protocol.TABLES, status=200)
    answer = json.loads(raw)
    assert "broken" in answer["unavailable"], answer["unavailable"]  # why, with its files
    assert {t["name"]: t["location"] for t in answer["tables"]}["t"].startswith("tables/t/")
    return raw


def shm_client(env: dict[str, Any]) -> ReplayClient:
    return ReplayClient(env["server"].url, transport="shm")


def shm_error(call: Callable[[], Any]) -> bytes:
    try:
        call()
    except ServerError as err:
        return json.dumps(err.body or err.to_dict()).encode()
    raise AssertionError("the call did not fail")


def shm_extend_on_a_full_disk(env: dict[str, Any]) -> list[bytes]:
    client = shm_client(env)
    big = TensorDict({"x": torch.zeros(512, 1024)}, [512])
    with full_disk(env):
        return [shm_error(lambda: [client.extend("big", big) for _ in range(64)])]


def shm_clear_on_a_full_disk(env: dict[str, Any]) -> list[bytes]:
    client = shm_client(env)
    assert post(env, "big", "extend", big_rows(0, 1024), headers=ARROW)
    with full_disk(env, leave=0):
        return [shm_error(lambda: client.clear("big"))]


#: each case: what it does, and every answer it got
CASES: dict[str, Callable[[dict[str, Any]], list[bytes]]] = {
    "info": lambda env: [http(env, "GET", protocol.table_path("t"), status=200)],
    "list": lambda env: [listing(env)],
    "status": lambda env: [http(env, "GET", f"{protocol.API}/status", status=200)],
    "metrics": lambda env: [http(env, "GET", "/metrics", status=200)],
    "create_over_a_foreign_folder": lambda env: [
        http(env, "POST", protocol.TABLES, spec("alien", testkit.FIELDS, 16), status=409)
    ],
    "delete": lambda env: [
        http(env, "POST", protocol.TABLES, spec("gone", testkit.FIELDS, 16), status=201),
        http(env, "DELETE", protocol.table_path("gone"), status=204),
    ],
    "checkpoint": lambda env: [post(env, "t", "checkpoint", status=200)],
    "restore_missing": lambda env: [
        post(env, "t", "restore", {"path": "checkpoints/nowhere"}, status=400)
    ],
    "restore_damaged_metadata": lambda env: [
        post(env, "t", "restore", {"path": "checkpoints/bad/meta"}, status=422)
    ],
    "restore_missing_file": lambda env: [
        post(env, "t", "restore", {"path": "checkpoints/bad/gone"}, status=422)
    ],
    "restore": lambda env: [post(env, "t", "restore", {"path": "checkpoints/t"}, status=200)],
    "load_damaged": lambda env: [
        post(env, "t", "load", archive(env, damaged=True), headers=TAR, status=422)
    ],
    "load_damaged_in_parts": lambda env: load_in_parts(env, archive(env, damaged=True), 422),
    "load_in_parts": lambda env: load_in_parts(env, archive(env, damaged=False), 200),
    "checkpoint_on_a_full_disk": lambda env: on_full_disk(
        env, lambda: post(env, "t", "checkpoint", {"path": "checkpoints/x/full"}, status=507)
    ),
    "export_on_a_full_disk": lambda env: on_full_disk(
        env,
        lambda: post(env, "big", "export", {"format": "csv", "path": "exports/x.csv"}, status=507),
    ),
    "streamed_export_on_a_full_disk": lambda env: on_full_disk(
        env, lambda: post(env, "big", "export", {"format": "csv"}, status=507)
    ),
    "shm_info": lambda env: [json.dumps(shm_client(env).info("t")).encode()],
    "shm_update_priority": lambda env: [
        shm_error(lambda: shm_client(env).update_priority("t", [99], [1.0]))
    ],
    "shm_extend_on_a_full_disk": shm_extend_on_a_full_disk,
    "shm_clear_on_a_full_disk": shm_clear_on_a_full_disk,
}


@pytest.mark.parametrize("case", CASES)
def test_no_answer_names_the_data_root(env: dict[str, Any], case: str) -> None:
    root: Path = env["root"]
    secret = {str(root), os.path.realpath(root), str(root.parent), os.path.realpath(root.parent)}
    for answer in CASES[case](env):
        text = answer.decode(errors="replace")
        leaked = [s for s in secret if s in text]
        assert not leaked, f"{case}: {leaked} in {text[:2000]}"
