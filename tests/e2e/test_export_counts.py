"""An export says how many rows it wrote and how many it left out (live when it began, but
overwritten or removed before they were read), at every door: ``Table.export``'s path
(tests/storage/test_export.py), the route's JSON fields and headers, the client's return
value, the CLI's line. Before, only the server's log said that rows were left out."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from datasetkit import make_table, transitions
from testkit import run_cli

from tdreplay.client import ReplayClient
from tdreplay.codec import protocol


def test_every_door_reports_rows_written_and_skipped(
    client: ReplayClient,
    server: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = make_table(client)
    client.extend(name, transitions([3, 4]))
    path = protocol.table_path(name, "export")
    status, headers, body = server.request(
        "POST", path, json.dumps({"path": "exports/n.parquet"}).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    assert status == 200 and json.loads(body) == {
        "path": "exports/n.parquet", "rows": 7, "skipped": 0,
    }  # fmt: skip
    status, headers, body = server.request(
        "POST", path, b"{}", {"Content-Type": "application/json"}
    )
    assert status == 200 and body[:4] == b"PAR1"
    assert (headers["x-export-rows"], headers["x-export-skipped"]) == ("7", "0")

    written = client.export(name, path="exports/c.csv")
    assert written == "exports/c.csv" and (written.rows, written.skipped) == (7, 0)
    here = client.export(name, dest=tmp_path / "c.parquet")
    assert here == tmp_path / "c.parquet" and (here.rows, here.skipped) == (7, 0)
    ds = client.export(name, "minari", dest=tmp_path / "ds", dataset_id="counts/run-v0")
    assert (ds.rows, ds.skipped, ds.splits) == (7, 0, 0)
    on_server = client.export(name, "minari", path="exports/ds", dataset_id="counts/run-v0")
    assert (on_server.rows, on_server.skipped, on_server.splits) == (7, 0, 0)

    code, out, _ = run_cli(
        "export", name, "-o", str(tmp_path / "cli.parquet"),
        capsys=capsys, monkeypatch=monkeypatch, TDREPLAY_URL=server.url,
    )  # fmt: skip
    assert code == 0 and "7 rows written, 0 left out" in out


def test_the_offline_export_prints_the_counts_as_the_remote_one_does(
    client: ReplayClient,
    server: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``tdreplay export --checkpoint`` / ``--root`` (no server) printed the file's size only,
    though ``Table.export`` returns the rows written and left out."""
    name = make_table(client)
    client.extend(name, transitions([3, 4]))
    client.checkpoint(name, f"checkpoints/{name}")
    checkpoint = server.root / "checkpoints" / name
    root = tmp_path / "root"  # a data root no server holds, the table as its checkpoint
    shutil.copytree(checkpoint, root / "checkpoints" / name)
    counts = "; 7 rows written, 0 left out (overwritten or removed during the export)"
    for source in (["--checkpoint", str(checkpoint)], ["--root", str(root), name]):
        out = tmp_path / f"{source[0].strip('-')}.parquet"
        code, printed, err = run_cli(
            "export", *source, "-o", str(out), capsys=capsys, monkeypatch=monkeypatch
        )
        assert code == 0 and printed.rstrip().endswith(counts), (printed, err)
    code, printed, err = run_cli(
        "export", "--checkpoint", str(checkpoint), "--format", "minari",
        "--dataset-id", "counts/offline-v0", "-o", str(tmp_path / "ds"),
        capsys=capsys, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert code == 0 and counts in printed, (printed, err)


def test_a_live_export_counts_what_it_left_out(
    client: ReplayClient, server: Any, tmp_path: Path
) -> None:
    """A small ring filled as fast as a thread can while exports run: whatever the timing,
    the file holds the rows reported written, and written + skipped is what was live."""
    name = make_table(client)  # capacity 100
    client.extend(name, transitions([50, 50]))
    stop = threading.Event()

    def fill() -> None:
        with ReplayClient(server.url) as writer:
            while not stop.is_set():
                writer.extend(name, transitions([10]))

    thread = threading.Thread(target=fill)
    thread.start()
    try:
        for i in range(5):
            got = client.export(name, dest=tmp_path / f"live-{i}.parquet")
            assert got.rows == pq.read_metadata(got).num_rows
            # live when it began: at most the capacity (slots being written are not live)
            assert 0 < got.rows + got.skipped <= 100
    finally:
        stop.set()
        thread.join()
