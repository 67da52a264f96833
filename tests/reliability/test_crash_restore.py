"""Crashes during checkpoints, and periodic checkpoints: ``tdreplay serve --restore`` comes back.

A server killed while it checkpoints leaves ``<name>.tmp-<hex>`` (the new
copy, whole or not) and ``<name>.old-<hex>`` (the previous one, moved aside)
beside ``<name>``. :func:`plant` lays out every stage such a crash can leave,
from real checkpoints; one test really kills a server in the middle of a
periodic checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reliability_helpers import call, check_rows, create, extend, names, size
from service_helpers import rows, spec

from tdreplay.codec import protocol
from tdreplay.service.core import startup as service_startup
from tdreplay.storage import Table, TableSpec
from tdreplay.storage.debris import clean_checkpoints

#: rows in the older and the newer checkpoint of every planted table
OLD, NEW = 5, 12


def checkpoints_of(name: str, where: Path) -> tuple[Path, Path]:
    """Two complete checkpoints of table ``name``: OLD rows, then NEW rows."""
    table = Table.create(TableSpec.parse(spec(name, capacity=32)), where / "tables")
    try:
        table.extend(rows(0, OLD))
        old = table.checkpoint(where / "old" / name)
        table.extend(rows(OLD, NEW - OLD))
        new = table.checkpoint(where / "new" / name)
    finally:
        table.close()
    return old, new


def half_written(src: Path, dst: Path) -> None:
    """A copy of the checkpoint ``src`` cut short: no metadata.json, a truncated storage file."""
    shutil.copytree(src, dst)
    (dst / "metadata.json").unlink()
    stored = sorted(p for p in (dst / "storage").rglob("*") if p.is_file() and p.stat().st_size)
    with stored[0].open("r+b") as f:
        f.truncate(stored[0].stat().st_size // 2)


def plant(folder: Path, made: Path) -> dict[str, int | None]:
    """What crashes at every stage of a checkpoint leave; returns the rows each table must restore."""
    folder.mkdir(parents=True)
    ck = {name: checkpoints_of(name, made / name) for name in "abcde"}
    # a: killed while writing the new copy: the checkpoint and a half-written .tmp-
    shutil.copytree(ck["a"][1], folder / "a")
    half_written(ck["a"][1], folder / "a.tmp-0badc0de")
    # b: killed after the new copy was in place, before the old one was deleted
    shutil.copytree(ck["b"][1], folder / "b")
    shutil.copytree(ck["b"][0], folder / "b.old-00000001")
    # c: killed between the two renames: only copies set aside, the newest complete wins
    shutil.copytree(ck["c"][0], folder / "c.old-0000000a")
    shutil.copytree(ck["c"][1], folder / "c.old-0000000b")
    half_written(ck["c"][1], folder / "c.old-0000000c")  # torn: never restored
    now = time.time()
    for tag, age in (("a", 300), ("b", 200), ("c", 100)):
        os.utime(folder / f"c.old-0000000{tag}", (now - age, now - age))
    # d: killed before the first checkpoint of d was renamed into place: a whole .tmp- only
    shutil.copytree(ck["d"][1], folder / "d.tmp-12345678")
    # e: an old copy, torn, and no checkpoint: nothing to restore
    half_written(ck["e"][0], folder / "e.old-abcdef01")
    return {"a": NEW, "b": NEW, "c": NEW, "d": None, "e": None}


def test_clean_checkpoints_keeps_the_last_complete_one(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "checkpoints"
    expected = plant(folder, tmp_path / "made")
    done = clean_checkpoints(folder)
    assert done == [
        "deleted a.tmp-0badc0de (an unfinished checkpoint)",
        "deleted d.tmp-12345678 (an unfinished checkpoint)",
        "deleted b.old-00000001 (replaced by the complete checkpoint b)",
        "renamed c.old-0000000b back to c (the last complete checkpoint of c)",
        "deleted c.old-0000000a (an incomplete or older copy set aside)",
        "deleted c.old-0000000c (an incomplete or older copy set aside)",
        "deleted e.old-abcdef01 (an incomplete or older copy set aside)",
    ]
    kept = sorted(n for n, rows_ in expected.items() if rows_ is not None)
    assert sorted(p.name for p in folder.iterdir()) == kept
    assert service_startup.checkpoints_under(tmp_path / "data") == kept
    assert clean_checkpoints(folder) == []  # nothing left to do


def test_debris_is_not_taken_for_tables(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "checkpoints"
    plant(folder, tmp_path / "made")
    assert service_startup.checkpoints_under(tmp_path / "data") == [
        "a",
        "b",
    ]  # complete, real names


def test_restore_after_a_crash_at_every_stage_of_a_checkpoint(
    live_server: Callable[..., Any], tmp_path: Path
) -> None:
    root = tmp_path / "data"
    expected = plant(root / "checkpoints", tmp_path / "made")
    server = live_server("--restore", root=root)
    assert names(server) == sorted(n for n, r in expected.items() if r is not None)
    for name, n in expected.items():
        if n is not None:
            check_rows(server, n, name=name, batch=32)
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == names(server)


def test_debris_of_a_deeper_checkpoint_is_cleaned_on_start(
    live_server: Callable[..., Any], tmp_path: Path
) -> None:
    """A client's checkpoint may lie deeper (``checkpoints/<folder>/<name>``): what a crash
    left there (a killed checkpoint of a 256 MB table left its 257 MB ``.tmp-`` copy) stayed
    for good, restart after restart; it is cleaned on start as at the top."""
    root = tmp_path / "data"
    deep = root / "checkpoints" / "runs" / "deeper"
    expected = plant(deep, tmp_path / "made")
    server = live_server(root=root)
    assert sorted(p.name for p in deep.iterdir()) == ["a", "b", "c"]
    for name, n in expected.items():
        if n is not None:  # the complete ones are whole, and restore
            path = f"checkpoints/runs/deeper/{name}"
            body = json.dumps({"path": path}).encode()
            headers = {"Content-Type": "application/json"}
            call(server, "POST", protocol.table_path(name, "restore"), body=body, headers=headers)
            check_rows(server, n, name=name, batch=32)


def test_periodic_checkpoints_survive_kill_9(
    live_server: Callable[..., Any], tmp_path: Path
) -> None:
    root = tmp_path / "data"
    server = live_server("--checkpoint-every", "0.3", root=root)
    n = 300_000  # ~18 MB: a checkpoint takes long enough to be caught in the middle
    create(server, "t", capacity=n)
    create(server, "m", backend={"kind": "memmap"})  # durable on its own: not checkpointed
    extend(server, 0, n)
    extend(server, 0, 8, name="m")
    folder = root / "checkpoints"
    deadline = time.monotonic() + 60
    while True:  # a complete checkpoint with every row
        meta = folder / "t" / "metadata.json"
        if meta.exists() and json.loads(meta.read_text())["size"] == n:
            break
        assert time.monotonic() < deadline, server.output()[-3000:]
        time.sleep(0.02)
    # a change (the same items again), or the next rounds skip the unchanged table
    extend(server, 0, 8)
    while not any(p.name.startswith("t.tmp-") for p in folder.iterdir()):  # the next one starts
        assert time.monotonic() < deadline, server.output()[-3000:]
        time.sleep(0.001)
    server.proc.kill()  # SIGKILL, in the middle of a checkpoint
    server.proc.wait(10)
    assert not (folder / "m").exists()
    again = live_server("--restore", root=root)  # the dead server's lock is taken over
    assert names(again) == ["m", "t"]  # m reopened from its own files, t from its checkpoint
    check_rows(again, n)
    assert size(again, "m") == 8
    assert sorted(p.name for p in folder.iterdir()) == ["t"]
    assert size(again) == n
