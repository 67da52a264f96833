"""A command's failure says where it came from, and ``-o FILE`` keeps a file it finds.

An error a check made here (a local file the client refused, an argument it checked)
printed ``(InvalidRequest, HTTP 400)`` as though a server had answered it: only an
error a server answered with names an HTTP status now, and both exit 1. ``tdreplay
export -o FILE`` replaced a file there without a word; it refuses one now, naming it,
unless ``--force`` is given, and the file is as it was, with nothing left beside it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from testkit import run_cli

from tdreplay.client import ReplayClient

SCHEMA = (
    "name: t\ncapacity: 64\nbackend: {kind: memory}\nfields:\n  x: {shape: [2], dtype: int64}\n"
)


@pytest.fixture(scope="module")
def server(live_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = live_server()
    schema = tmp_path_factory.mktemp("schema") / "t.yaml"
    schema.write_text(SCHEMA)
    with ReplayClient(server.url) as client:
        client.create_table(schema)
        client.extend("t", {"x": torch.arange(16).reshape(8, 2)})
        client.checkpoint("t", "checkpoints/t")
    return server


def tdreplay(server: Any, *argv: str, **kw: Any) -> tuple[int, str, str]:
    return run_cli(*argv, TDREPLAY_URL=server.url, **kw)


def test_only_a_servers_answer_names_an_http_status(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = {"capsys": capsys, "monkeypatch": monkeypatch}
    garbage = tmp_path / "bad.parquet"
    garbage.write_bytes(b"not parquet at all")
    for argv, said, kind in [
        (["import", "t", str(garbage)], "is not a readable Parquet file", "InvalidRequest"),
        (["import", "t", str(tmp_path / "gone.parquet")], "no such file", "InvalidRequest"),
        (["export", "t", "-o", str(tmp_path)], "is a folder", "InvalidRequest"),
    ]:
        code, _, err = tdreplay(server, *argv, **cli)
        line = err.strip()
        assert code == 1 and said in line and "\n" not in line, (argv, err)
        assert f"({kind})" in line and "HTTP" not in line, (argv, line)
    code, _, err = tdreplay(server, "info", "nope", **cli)  # the server's answer: its status
    assert code == 1 and "no table 'nope'" in err and "(TableNotFound, HTTP 404)" in err, err
    # sharded, a streamed export has no one server's file: refused here, no traceback
    code, _, err = tdreplay(
        server, "export", "t", "-o", str(tmp_path / "x.parquet"), "--url", server.url,
        "--url", server.url, **cli,
    )  # fmt: skip
    assert code == 1 and "(InvalidRequest)" in err and "HTTP" not in err, err
    assert not (tmp_path / "x.parquet").exists()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p for p in os.listdir(folder) if p.startswith("."))


def test_export_keeps_an_existing_file_unless_forced(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = {"capsys": capsys, "monkeypatch": monkeypatch}
    target = tmp_path / "t.parquet"
    target.write_bytes(b"the user's own file")
    stat = target.stat()
    for where in (
        [],  # streamed from the server
        ["--checkpoint", str(server.root / "checkpoints" / "t")],  # offline
    ):
        code, out, err = tdreplay(server, "export", "t", "-o", str(target), *where, **cli)
        assert code == 1 and not out, (where, out, err)
        assert err.strip() == (
            f"tdreplay export: {target} exists; give --force to replace it (nothing was written)"
        ), (where, err)
        assert target.read_bytes() == b"the user's own file", where
        assert target.stat().st_mtime_ns == stat.st_mtime_ns and _leftovers(tmp_path) == []

    for where in ([], ["--checkpoint", str(server.root / "checkpoints" / "t")]):
        target.write_bytes(b"the user's own file")
        code, out, err = tdreplay(
            server, "export", "t", "-o", str(target), "--force", *where, **cli
        )
        assert code == 0 and "8 rows written" in out, (where, err)
        assert pq.read_table(target).num_rows == 8 and _leftovers(tmp_path) == []
    # a new file needs no --force
    code, out, err = tdreplay(server, "export", "t", "-o", str(tmp_path / "new.csv"), **cli)
    assert code == 0 and (tmp_path / "new.csv").read_text().startswith('"x[0]","x[1]"'), err
