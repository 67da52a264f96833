"""One table that cannot be loaded on start never keeps the others from being served.

A damaged checkpoint, a checkpoint folder holding another table, damaged
durable state of a memmap table: the server starts, serves the rest, names
the table under ``unavailable`` in ``GET /v1/tables`` and keeps its files as
they are (never deleted, never overwritten by a fresh table).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from reliability_helpers import call, create, extend, names, size
from service_helpers import FIELDS
from tensordict import TensorDict

from tdreplay.codec import protocol
from tdreplay.service import Settings, create_app
from tdreplay.storage import InvalidCheckpoint, Table, TableSpec
from tdreplay.storage.debris import clean_checkpoints


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def listing(server: Any) -> dict[str, Any]:
    return json.loads(call(server, "GET", protocol.TABLES))


def test_damaged_and_foreign_checkpoints_do_not_stop_the_start(
    live_server: Any, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    schema = tmp_path / "s"
    schema.mkdir()
    for name in ("a", "b"):
        spec = {"name": name, "capacity": 16, "fields": FIELDS, "backend": {"kind": "memory"}}
        (schema / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    server = live_server(schema=schema, root=root)
    extend(server, 0, 4, name="a")
    extend(server, 0, 6, name="b")
    call(server, "POST", protocol.table_path("a", "checkpoint"))
    call(server, "POST", protocol.table_path("b", "checkpoint"))
    server.stop()
    cks = root / "checkpoints"
    shutil.copytree(cks / "a", cks / "zz")  # a folder named zz holding table a
    (cks / "b" / "state.safetensors").write_bytes(b"damaged")
    before = tree(cks)
    again = live_server("--restore", schema=schema, root=root)
    assert names(again) == ["a"]  # zz is not taken for a table, b is not served
    assert size(again, "a") == 4
    unavailable = listing(again)["unavailable"]
    assert list(unavailable) == ["b"] and "state.safetensors" in unavailable["b"]
    status, _, raw = again.request("GET", "/readyz")
    assert status == 200 and json.loads(raw) == {
        "status": "ready",
        "tables": 1,
        "lost": 0,
        "unreachable": 0,
        "failed": 1,
    }
    again.stop()  # its shutdown checkpoint of a may not touch b's
    after = tree(cks)
    assert {k: v for k, v in after.items() if k.startswith(("b/", "zz/"))} == {
        k: v for k, v in before.items() if k.startswith(("b/", "zz/"))
    }


def test_damaged_durable_state_is_kept_and_the_rest_served(
    live_server: Any, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    server = live_server(root=root)
    create(server, "m", backend={"kind": "memmap"})
    create(server, "n", backend={"kind": "memmap"})
    extend(server, 0, 5, name="m")
    extend(server, 0, 3, name="n")
    server.stop()
    record = root / "tables" / "m" / "storage" / ".tdreplay-state" / "record.bin"
    record.write_bytes(record.read_bytes()[:100])  # truncated
    before = tree(root / "tables" / "m")
    again = live_server(root=root)
    assert names(again) == ["n"] and size(again, "n") == 3
    assert "record.bin" in listing(again)["unavailable"]["m"]
    status, _, raw = again.request(
        "POST",
        protocol.TABLES,
        json.dumps({"name": "m", "capacity": 8, "fields": FIELDS}).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 409, raw  # its data is there: never replaced behind the operator's back
    again.stop()
    assert tree(root / "tables" / "m") == before


def test_a_forged_state_is_refused_on_restore(tables: Any, tmp_path: Path) -> None:
    from tdreplay.storage import statefile

    spec = TableSpec.model_validate(
        {"name": "t", "capacity": 8, "fields": {"x": {"shape": [], "dtype": "int64"}}}
    )
    table = tables.create(spec)
    table.extend(TensorDict({"x": torch.arange(6)}, [6]))
    path = table.checkpoint(tmp_path / "ck")
    good = statefile.load_state(path)
    for forge in (
        lambda s: s["slots"]["ordinal"].__setitem__(3, 0),  # a live slot without an ordinal
        lambda s: s["slots"]["ordinal"].__setitem__(3, 3),  # two live slots with one ordinal
        lambda s: s["slots"].__setitem__("inserted", 2**63 - 2),  # past what int64 counts
        lambda s: s["slots"]["times_sampled"].__setitem__(0, -5),
        lambda s: s["rate_limiter"].__setitem__("samples", 10**40),
        lambda s: s.__setitem__("episode_base", 2**70),
    ):
        state = statefile.load_state(path)
        forge(state)
        statefile.save_state(path, state)
        with pytest.raises(InvalidCheckpoint):
            Table.restore(path, root=tmp_path / "r")
        statefile.save_state(path, good)
    assert tables.restore(path, root=tmp_path / "r").size == 6


def test_restore_refuses_a_spec_changed_since_it_was_checked(tables: Any, tmp_path: Path) -> None:
    spec = TableSpec.model_validate(
        {"name": "t", "capacity": 8, "fields": {"x": {"shape": [], "dtype": "int64"}}}
    )
    table = tables.create(spec)
    path = table.checkpoint(tmp_path / "ck")
    other = spec.model_copy(update={"capacity": 9})
    with pytest.raises(InvalidCheckpoint, match="changed while it was being restored"):
        Table.restore(path, root=tmp_path / "r", expect=other)
    assert not (tmp_path / "r" / "tables" / "t" / "storage").exists()
    restored = tables.track(Table.restore(path, root=tmp_path / "r", expect=spec))
    assert restored.size == 0


def test_debris_cleaning_never_deletes_a_folder_it_cannot_vouch_for(tmp_path: Path) -> None:
    spec = TableSpec.model_validate(
        {"name": "t", "capacity": 8, "fields": {"x": {"shape": [], "dtype": "int64"}}}
    )
    table = Table.create(spec, tmp_path / "data")
    cks = tmp_path / "checkpoints"
    table.checkpoint(cks / "userdir.old-0a1b2c3d")
    table.destroy()
    (cks / "userdir").mkdir()
    (cks / "userdir" / "file").write_text("the operator's")
    done = clean_checkpoints(cks)
    assert (cks / "userdir" / "metadata.json").exists()  # the complete checkpoint, renamed back
    aside = [p for p in cks.iterdir() if p.name.startswith("userdir.incomplete-")]
    assert len(aside) == 1 and (aside[0] / "file").read_text() == "the operator's"
    assert any("moved userdir aside" in line for line in done)


def test_max_tables(tmp_path: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `httpx`")
        from fastapi.testclient import TestClient

    app = create_app(Settings(root=tmp_path / "data", max_tables=2, torch_threads=0))
    with TestClient(app) as client:
        for i in range(2):
            body = {"name": f"t{i}", "capacity": 4, "fields": FIELDS, "backend": {"kind": "memory"}}
            assert client.post(protocol.TABLES, json=body).status_code == 201
        body = {"name": "t2", "capacity": 4, "fields": FIELDS, "backend": {"kind": "memory"}}
        r = client.post(protocol.TABLES, json=body)
        assert r.status_code == 507 and "--max-tables" in r.json()["detail"], r.text
        assert client.delete(protocol.table_path("t0")).status_code == 204
        assert client.post(protocol.TABLES, json=body).status_code == 201
