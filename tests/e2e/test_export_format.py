"""One rule decides an export file's format (:func:`tdreplay.codec.exports.export_format`) at
every door: ``Table.export``, the server's export route, the client writing ``dest``, and
``tdreplay export`` with ``-o``, ``--on-server`` and ``--checkpoint``. A suffix names the
format; a format given that the suffix contradicts is refused, as is a suffix naming none
when no format is given; nothing is written for a refused name."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from datasetkit import make_table, transitions
from testkit import run_cli

from tdreplay.client import InvalidRequest, ReplayClient
from tdreplay.storage import InvalidRequest as StorageInvalidRequest
from tdreplay.storage import Table, TableSpec

CSV_HEAD = '"observation[0]"'


def is_parquet(path: Path) -> bool:
    return path.read_bytes()[:4] == b"PAR1"


def test_the_library_refuses_a_format_its_suffix_contradicts(tmp_path: Path) -> None:
    spec = TableSpec.model_validate(
        {
            "name": "t",
            "capacity": 8,
            "backend": {"kind": "memory"},
            "fields": {"observation": {"shape": [2], "dtype": "float32"}},
        }
    )
    table = Table.create(spec, root=tempfile.mkdtemp(dir=tmp_path))
    for name, fmt in [("a.parquet", "csv"), ("a.PQ", "csv"), ("a.csv", "parquet")]:
        with pytest.raises(StorageInvalidRequest, match=f"export format '{fmt}' does not match"):
            table.export(tmp_path / name, format=fmt)
        assert not (tmp_path / name).exists()
    assert is_parquet(table.export(tmp_path / "b.PQ"))
    assert table.export(tmp_path / "b.txt", format="csv").read_text().startswith('"observation')


def test_the_server_and_the_client_follow_the_rule(
    client: ReplayClient, server: Any, tmp_path: Path
) -> None:
    name = make_table(client)
    client.extend(name, transitions([3, 4]))
    exports = server.root / "exports"
    with pytest.raises(InvalidRequest, match=r"'csv' does not match 'x\.parquet'"):
        client.export(name, "csv", path="exports/x.parquet")
    # no format: the suffix tells it (a .csv name got Parquet: the body's default)
    client.export(name, path="exports/x.csv")
    assert (exports / "x.csv").read_text().startswith(CSV_HEAD)
    with pytest.raises(InvalidRequest, match=r"cannot tell the export format from 'x\.txt'"):
        client.export(name, path="exports/x.txt")
    client.export(name, "csv", path="exports/y.txt")
    assert (exports / "y.txt").read_text().startswith(CSV_HEAD)
    assert sorted(p.name for p in exports.iterdir()) == ["x.csv", "y.txt"]
    with pytest.raises(InvalidRequest, match=r"'csv' does not match 'z\.parquet'"):
        client.export(name, "csv", dest=tmp_path / "z.parquet")
    assert client.export(name, dest=tmp_path / "z.csv").read_text().startswith(CSV_HEAD)
    assert list(tmp_path.iterdir()) == [tmp_path / "z.csv"]
    assert pq.read_table(client.export(name, dest=tmp_path / "z.pq")).num_rows == 7


def test_the_cli_follows_the_rule(
    client: ReplayClient,
    server: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = make_table(client)
    client.extend(name, transitions([3, 4]))

    def cli(*argv: str) -> tuple[int, str, str]:
        return run_cli(
            "export", *argv, capsys=capsys, monkeypatch=monkeypatch, TDREPLAY_URL=server.url
        )

    out = tmp_path / "out"
    code, _, err = cli(name, "-o", str(out / "x.txt"))  # it wrote Parquet into x.txt
    assert code == 2 and "cannot tell the export format from 'x.txt'" in err and "--format" in err
    code, _, err = cli(name, "--format", "csv", "-o", str(out / "x.parquet"))
    assert code == 2 and "'csv' does not match 'x.parquet'" in err
    code, _, err = cli(name, "--format", "csv", "--on-server", "exports/cli.parquet")
    assert code == 2 and "'csv' does not match 'cli.parquet'" in err
    assert not out.exists() and not (server.root / "exports" / "cli.parquet").exists()
    assert cli(name, "--format", "csv", "-o", str(out / "x.txt"))[0] == 0
    assert (out / "x.txt").read_text().startswith(CSV_HEAD)
    code, printed, _ = cli(name, "-o", str(out / "x.pq"))
    assert code == 0 and is_parquet(out / "x.pq") and "7 rows" in printed

    client.checkpoint(name, f"checkpoints/{name}")  # offline: the same rule
    checkpoint = str(server.root / "checkpoints" / name)
    code, _, err = cli("--checkpoint", checkpoint, "-o", str(out / "c.txt"))
    assert code == 2 and "cannot tell the export format from 'c.txt'" in err
    code, _, err = cli("--checkpoint", checkpoint, "--format", "parquet", "-o", str(out / "c.csv"))
    assert code == 2 and "'parquet' does not match 'c.csv'" in err
    assert sorted(p.name for p in out.iterdir()) == ["x.pq", "x.txt"]
