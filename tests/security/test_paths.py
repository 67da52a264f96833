"""The data root's areas on a real server: client paths stay in theirs, and nothing else is touched.

Tables live in ``<root>/tables/<name>/`` (a folder carrying ``.tdreplay-table.json``),
named by the server from the table's name; checkpoints and restores go inside
``<root>/checkpoints/``, exports inside ``<root>/exports/``. Every refused probe
is checked twice: its status, and that the whole tree of the root and of a
sibling "outside" folder (kinds, file contents, link targets) is exactly as
before.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import testkit

from tdreplay.codec import encode, protocol

JSON = {"Content-Type": protocol.JSON}
ARROW = {"Content-Type": protocol.ARROW_STREAM}
MARKER = ".tdreplay-table.json"


def spec(name: str, kind: str = "memmap", **backend: Any) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": 16,
        "fields": dict(testkit.FIELDS),
        "backend": {"kind": kind, **backend},
    }


def call(server: Any, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    status, _, raw = server.request(method, path, data, JSON if data is not None else {})
    try:
        return status, json.loads(raw) if raw else {}
    except ValueError:
        return status, {"raw": raw}


def snapshot(*folders: Path) -> dict[str, Any]:
    """Every entry under ``folders``, not following links: kind, and content hash or link target."""
    out: dict[str, Any] = {}
    for top in folders:
        out[str(top)] = "dir" if top.is_dir() else None
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                if p.is_symlink():
                    out[str(p)] = ("link", os.readlink(p))
                elif p.is_dir():
                    out[str(p)] = "dir"
                elif p.is_socket():  # the server's same-host socket (run/): no content
                    out[str(p)] = "socket"
                else:
                    out[str(p)] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    return out


@pytest.fixture(scope="module")
def env(live_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A server with tables ``t`` and ``u`` (memmap), ``u`` checkpointed, and user things in its areas."""
    base = tmp_path_factory.mktemp("paths")
    root = base / "data"
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("keep me")
    server = live_server(root=root)
    for name in ("t", "u"):
        status, body = call(server, "POST", protocol.TABLES, spec(name))
        assert status == 201, body
        status, _, raw = server.request(
            "POST",
            protocol.table_path(name, "extend"),
            encode(testkit.rows(0, 8)).to_pybytes(),
            ARROW,
        )
        assert status == 200, raw
    status, body = call(server, "POST", protocol.table_path("u", "checkpoint"))
    assert status == 200 and body["path"] == "checkpoints/u", body
    cks, exports = root / "checkpoints", root / "exports"
    exports.mkdir(exist_ok=True)
    (cks / "mine").mkdir()
    (cks / "mine" / "notes.txt").write_text("user data")
    (cks / "note.txt").write_text("user file")
    (cks / "out").symlink_to(outside)  # a link inside the area pointing out of the root
    (cks / "totables").symlink_to(root / "tables")  # a link inside the area into tables/
    (exports / "taken.csv").write_text("a,b\n1,2\n")
    (exports / "dir").mkdir()
    (exports / "dir" / "keep.txt").write_text("user data")
    (exports / "out").symlink_to(outside)
    (exports / "totables").symlink_to(root / "tables")
    return {"server": server, "root": root, "outside": outside}


def probe(env: dict[str, Any], action: str, body: dict[str, Any], status: int) -> dict[str, Any]:
    """POST ``body`` to table t's ``action``: answered ``status``, and nothing on disk changed."""
    before = snapshot(env["root"], env["outside"])
    got, answer = call(env["server"], "POST", protocol.table_path("t", action), body)
    assert got == status, (body, answer)
    assert snapshot(env["root"], env["outside"]) == before, (body, answer)
    return answer


def outside_root(env: dict[str, Any]) -> list[str]:
    """Paths leading out of the data root, every way (and absolute ones into the wrong places)."""
    outside: Path = env["outside"]
    root: Path = env["root"]
    return [
        str(root),
        str(root / "tables" / "t"),
        str(root / "tables" / "u" / "x"),
        str(root / "checkpoints"),
        str(root / "checkpoints" / ".." / "tables" / "t"),
        str(outside / "ck"),  # absolute, elsewhere
        str(outside),
        "/",
        "../outside/ck",
        "..",
        "checkpoints/../../outside/ck",
        "exports/../../outside/x.csv",
        "checkpoints/out",  # a link out of the root
        "checkpoints/out/ck",
        "exports/out/x.csv",
    ]


def out_of_area(area: str) -> list[str]:
    """Paths inside the root but not inside ``area``."""
    other = "exports" if area == "checkpoints" else "checkpoints"
    return [
        ".",
        "",
        area,
        f"{area}/",
        f"{area}/.",
        f"{area}/x/..",
        other + "/x",
        "x",
        ".lock",
        "tables",
        "tables/t",
        "tables/t/storage",
        "tables/t/x",
        "tables/u",  # another table's folder
        "tables/u/new",
        "tables/new",
        f"{MARKER}",
        f"{area}/../tables/t",
        f"{area}/../tables/u/x",
        f"{area}/totables",  # a link into tables/
        f"{area}/totables/t",
        f"{area}/totables/new",
    ]


def malformed(area: str) -> list[str]:
    return [
        f"{area}/a\x00b",
        "\x00",
        f"{area}/" + "a" * 300,  # one name over 255 bytes
        f"{area}/" + "/".join(["a" * 200] * 6),  # over 1024 bytes in all
        f"{area}/\udcff",  # not encodable
    ]


def test_checkpoint_paths_outside_the_area_are_refused(env: dict[str, Any]) -> None:
    for path in outside_root(env) + out_of_area("checkpoints") + malformed("checkpoints"):
        answer = probe(env, "checkpoint", {"path": path}, 400)
        assert answer["type"] == "InvalidRequest", (path, answer)


def test_checkpoint_through_a_file_or_into_a_checkpoint_is_refused(env: dict[str, Any]) -> None:
    for path in [
        "checkpoints/note.txt/x",
        "checkpoints/u/x",  # inside another table's checkpoint
        "checkpoints/u/inner/deeper",
        "checkpoints/mine/notes.txt/x",
    ]:
        probe(env, "checkpoint", {"path": path}, 400)


def test_checkpoint_never_replaces_what_is_not_its_own(env: dict[str, Any]) -> None:
    for path in [
        "checkpoints/mine/notes.txt",  # a user file, deeper down
        "checkpoints/mine/../mine/notes.txt",
    ]:
        answer = probe(env, "checkpoint", {"path": path}, 409)
        assert answer["type"] == "PathExists" and answer["field"] == "path", (path, answer)
    # checkpoints/<x> is table x's own default checkpoint (restored as x on start): another
    # table may not write there, whatever is there (another table's checkpoint, user files)
    for path in ["checkpoints/u", "checkpoints/./u", "checkpoints/mine", "checkpoints/note.txt"]:
        answer = probe(env, "checkpoint", {"path": path}, 400)
        assert "default checkpoint of table" in answer["detail"], (path, answer)
    # names of interrupted checkpoints are the server's, at any depth
    for path in [
        "checkpoints/t.old-0a1b2c3d",
        "checkpoints/deep/x.tmp-0a1b2c3d",
        "checkpoints/a/t.incomplete-1",
    ]:
        answer = probe(env, "checkpoint", {"path": path}, 400)
        assert "interrupted checkpoints" in answer["detail"], (path, answer)
    # an absolute path is refused even when it leads into the area
    answer = probe(env, "checkpoint", {"path": str(env["root"] / "checkpoints" / "u")}, 400)
    assert "absolute" in answer["detail"], answer


def test_restore_paths_outside_the_area_are_refused(env: dict[str, Any]) -> None:
    for path in outside_root(env) + out_of_area("checkpoints") + malformed("checkpoints"):
        if path == "":  # an empty path means the default (checkpoints/t), covered below
            continue
        answer = probe(env, "restore", {"path": path}, 400)
        assert answer["type"] == "InvalidRequest", (path, answer)


def test_restore_of_what_is_no_checkpoint_of_the_table_changes_nothing(env: dict[str, Any]) -> None:
    for path in [
        "checkpoints/u",  # another table's checkpoint
        "checkpoints/mine",
        "checkpoints/note.txt",
        "checkpoints/nothing-here",
        "checkpoints/u/x",
    ]:
        probe(env, "restore", {"path": path}, 400)


def test_export_paths_outside_the_area_are_refused(env: dict[str, Any]) -> None:
    for path in outside_root(env) + out_of_area("exports") + malformed("exports"):
        answer = probe(env, "export", {"path": path, "format": "csv"}, 400)
        assert answer["type"] == "InvalidRequest", (path, answer)
    for path in ["exports/taken.csv/x.csv", "exports/dir/keep.txt/x.csv"]:
        probe(env, "export", {"path": path, "format": "csv"}, 400)


def test_export_never_replaces_anything(env: dict[str, Any]) -> None:
    for path in ["exports/taken.csv", "exports/dir", "exports/dir/keep.txt", "exports/./dir"]:
        answer = probe(env, "export", {"path": path, "format": "csv"}, 409)
        assert answer["type"] == "PathExists", (path, answer)


def test_a_spec_cannot_name_a_path(env: dict[str, Any]) -> None:
    outside = str(env["outside"] / "x")
    root, server = env["root"], env["server"]
    for body in [
        spec("p1", "memmap", path=outside),
        spec("p2", "h5", path=outside),
        spec("p3", "memmap", location=outside),
        spec("p4", "memmap", path="checkpoints/u"),
        {**spec("p5"), "path": outside},
        {**spec("p6"), "root": outside},
    ]:
        before = snapshot(root, env["outside"])
        status, answer = call(server, "POST", protocol.TABLES, body)
        assert status == 422 and answer["type"] == "SchemaError", (body, answer)
        assert snapshot(root, env["outside"]) == before
    assert {t["name"] for t in call(server, "GET", protocol.TABLES)[1]["tables"]} == {"t", "u"}


@pytest.mark.parametrize("replace", [False, True])
def test_a_table_folder_tdreplay_did_not_make_is_never_used(
    env: dict[str, Any], replace: bool
) -> None:
    root, server = env["root"], env["server"]
    tables = root / "tables"
    if not (tables / "userdir").exists():
        (tables / "userdir").mkdir()
        (tables / "userdir" / "data.bin").write_bytes(b"\x01" * 100)
        (tables / "afile").write_text("a file")
        (tables / "alink").symlink_to(env["outside"])
        (tables / "alink2").symlink_to(tables / "t")  # a link to another table's own folder
        (tables / "othermark").mkdir()
        (tables / "othermark" / MARKER).write_text(json.dumps({"table": "t"}))
        (tables / "badmark").mkdir()
        (tables / "badmark" / MARKER).write_text("not json")
    query = "?replace=true" if replace else ""
    for name in ["userdir", "afile", "alink", "alink2", "othermark", "badmark"]:
        for kind in ["memmap", "h5"]:
            before = snapshot(root, env["outside"])
            status, answer = call(server, "POST", protocol.TABLES + query, spec(name, kind))
            assert status == 409, (name, kind, answer)
            assert answer["type"] == "TableExists" and name in answer["detail"], answer
            assert f"<root>/tables/{name}" in answer["detail"], answer  # relative to the root
            assert snapshot(root, env["outside"]) == before, (name, kind)
    listed = {t["name"] for t in call(server, "GET", protocol.TABLES)[1]["tables"]}
    assert listed == {"t", "u"}


def test_a_served_table_cannot_be_created_again(env: dict[str, Any]) -> None:
    root, server = env["root"], env["server"]
    for query in ["", "?replace=true"]:
        for kind in ["memmap", "memory"]:
            before = snapshot(root, env["outside"])
            status, answer = call(server, "POST", protocol.TABLES + query, spec("t", kind))
            assert status == 409 and answer["type"] == "TableExists", answer
            assert snapshot(root, env["outside"]) == before


def test_paths_inside_the_areas_work(env: dict[str, Any]) -> None:
    """The control: the same routes with good paths succeed (this changes the tree, so it runs late)."""
    server, root = env["server"], env["root"]
    status, body = call(
        server, "POST", protocol.table_path("t", "checkpoint"), {"path": "checkpoints/a/b"}
    )
    assert status == 200 and body["path"] == "checkpoints/a/b", body
    assert (root / "checkpoints/a/b/metadata.json").exists()
    # a checkpoint replaces a checkpoint of the same table
    status, body = call(
        server, "POST", protocol.table_path("t", "checkpoint"), {"path": "checkpoints/a/b"}
    )
    assert status == 200, body
    status, body = call(
        server, "POST", protocol.table_path("t", "restore"), {"path": "checkpoints/a/b"}
    )
    assert status == 200 and body["size"] == 8, body
    path = {"path": "exports/run.csv", "format": "csv"}
    status, body = call(server, "POST", protocol.table_path("t", "export"), path)
    assert status == 200 and body["path"] == "exports/run.csv", body
    assert len((root / "exports/run.csv").read_text().splitlines()) == 9  # header + 8 rows
    status, body = call(server, "POST", protocol.table_path("t", "export"), path)
    assert status == 409 and body["type"] == "PathExists", body


def test_a_memmap_table_is_reopened_by_a_server_without_its_schema(
    env: dict[str, Any], live_server: Any
) -> None:
    """Last in the module: stops the shared server and starts another on the same root."""
    root: Path = env["root"]
    env["server"].stop()
    server = live_server(root=root)
    env["server"] = server
    tables = {t["name"]: t for t in call(server, "GET", protocol.TABLES)[1]["tables"]}
    assert set(tables) == {"t", "u"}, tables
    assert tables["u"]["size"] == 8 and tables["t"]["size"] == 8, tables
    # the user's folders under tables/ were neither served nor touched
    assert (root / "tables/userdir/data.bin").read_bytes() == b"\x01" * 100
    assert (root / "tables/afile").read_text() == "a file"
    before = snapshot(root, env["outside"])
    status, answer = call(server, "POST", protocol.TABLES, spec("u"))
    assert status == 409 and answer["type"] == "TableExists", answer
    status, answer = call(server, "POST", protocol.TABLES + "?replace=true", spec("u"))
    assert status == 409 and answer["type"] == "TableExists", answer
    assert snapshot(root, env["outside"]) == before
    status, _, raw = server.request("POST", protocol.table_path("u", "sample") + "?batch_size=4")
    assert status == 200, raw
    status, _, raw = server.request("DELETE", protocol.table_path("u"))
    assert status == 204, raw
    assert not os.path.lexists(root / "tables/u")
    assert (root / "checkpoints/u/metadata.json").exists()  # its checkpoint is not its folder
    assert (root / "tables/t" / MARKER).exists()
    assert {t["name"] for t in call(server, "GET", protocol.TABLES)[1]["tables"]} == {"t"}
