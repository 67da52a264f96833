"""A Minari export that fails leaves nothing it created: not the datasets root it made for
the dataset (nor that root's parents), by the client (either twin), by the CLI through a
server or offline from a checkpoint; a folder that was there before is kept as it was."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from datasetkit import make_table
from testkit import run_cli as cli

from tdreplay.client import AsyncReplayClient, ReplayClient, SchemaError, TableNotFound


def tree(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_a_failed_minari_export_leaves_no_folder_it_made(
    client: ReplayClient, server: Any, tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    empty = make_table(client)  # no rows: a Minari dataset needs an episode
    dest = tmp_path / "new" / "datasets"
    with pytest.raises(SchemaError, match="holds no rows"):
        client.export(empty, format="minari", dest=dest, dataset_id="t/empty-v0")
    assert tree(tmp_path) == []
    with pytest.raises(TableNotFound):  # refused by the server after the root was made
        client.export("no-such-table", format="minari", dest=dest, dataset_id="t/none-v0")
    assert tree(tmp_path) == []

    async def export_async() -> None:
        async with AsyncReplayClient(server.url) as aclient:
            await aclient.export(empty, format="minari", dest=dest, dataset_id="t/empty-v0")

    with pytest.raises(SchemaError, match="holds no rows"):
        asyncio.run(export_async())
    assert tree(tmp_path) == []

    # folders that were there stay, empty or not, with what they held
    dest.mkdir(parents=True)
    (tmp_path / "new" / "mine.txt").write_text("kept")
    with pytest.raises(SchemaError, match="holds no rows"):
        client.export(empty, format="minari", dest=dest, dataset_id="ns/t/empty-v0")
    assert tree(tmp_path) == ["new", "new/datasets", "new/mine.txt"]

    for var in ("TDREPLAY_URL", "TDREPLAY_TOKEN", "TDREPLAY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    other = tmp_path / "cli" / "datasets"
    code, _, err = cli(
        "export", empty, "--format", "minari", "--dataset-id", "cli/e-v0", "-o", str(other),
        "--url", server.url, capsys=capsys,
    )  # fmt: skip
    assert code == 1 and "holds no rows" in err
    assert not (tmp_path / "cli").exists()
    client.checkpoint(empty, f"checkpoints/{empty}")
    code, _, err = cli(
        "export", "--checkpoint", str(server.root / "checkpoints" / empty), "--format",
        "minari", "--dataset-id", "cli/off-v0", "-o", str(other), capsys=capsys,
    )  # fmt: skip
    assert code == 1 and "holds no rows" in err
    assert not (tmp_path / "cli").exists()


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_a_failed_file_export_leaves_no_folder_it_made(
    client: ReplayClient, server: Any, tmp_path: Path, suffix: str, capsys: Any
) -> None:
    """``export(dest=new/dir/out.parquet)`` made ``new/dir`` for its hidden file and kept
    it when the export failed (a table not found): the Minari export's rule, for files."""
    dest = tmp_path / "new" / "dir" / f"out.{suffix}"
    with pytest.raises(TableNotFound):
        client.export("no-such-table", dest=dest)
    assert tree(tmp_path) == []
    code, _, err = cli(
        "export", "no-such-table", "-o", str(dest), "--url", server.url, capsys=capsys
    )  # fmt: skip
    assert code == 1 and "no-such-table" in err
    assert tree(tmp_path) == []
    (tmp_path / "new").mkdir()  # a folder that was there stays
    with pytest.raises(TableNotFound):
        client.export("no-such-table", dest=dest)
    assert tree(tmp_path) == ["new"]
