"""Datasets out and in against a real server: streamed Parquet/CSV exports, Minari datasets
(written here from a streamed export, on the server with path=, and by the CLI with and
without a server) read back by minari itself, Minari datasets imported into tables, and a
Parquet export read by Hugging Face ``datasets``. Parquet imports: test_parquet_import.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import minari
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from datasetkit import FIELDS, contains_every_step, hidden, make_table, transitions
from testkit import run_cli as cli

from tdreplay.client import InvalidRequest, PathExists, ReplayClient, SchemaError, TableNotFound

LENGTHS = [3, 5, 2, 4]


def load(root: Path, dataset_id: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return minari.load_dataset(dataset_id)


def test_streamed_export_is_atomic(client: ReplayClient, tmp_path: Path) -> None:
    name = make_table(client)
    client.extend(name, transitions(LENGTHS))
    dest = tmp_path / "out" / "rows.parquet"
    assert client.export(name, dest=dest) == dest
    assert (
        pq.read_table(dest).to_pydict()
        == pq.read_table(pa.BufferReader(client.export(name))).to_pydict()
    )
    csv = client.export(name, "csv", dest=tmp_path / "rows.csv")
    assert csv.read_text().splitlines()[0].startswith('"observation[0]"')
    with pytest.raises(TableNotFound):
        client.export("no-such-table", dest=tmp_path / "none.parquet")
    assert not (tmp_path / "none.parquet").exists() and hidden(tmp_path) == []


def test_minari_export_here_and_import(
    client: ReplayClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = make_table(client)
    client.extend(name, transitions(LENGTHS, truncate_last=True))
    root = tmp_path / "datasets"
    folder = client.export(
        name, format="minari", dest=root, dataset_id="tdreplay/run-v0", env_spec="CartPole-v1"
    )
    assert folder == root / "tdreplay" / "run-v0" and hidden(root) == []
    ds = load(root, "tdreplay/run-v0", monkeypatch)
    assert [len(e) for e in ds.iterate_episodes()] == LENGTHS
    second = ds[1]
    assert second.observations.shape == (6, 3) and second.observations[:, 1].tolist() == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]
    assert second.rewards.tolist() == [10, 11, 12, 13, 14]
    assert second.terminations.tolist() == [False] * 4 + [True]
    assert ds[3].truncations.tolist() == [False] * 3 + [True]
    meta = ds.storage.metadata
    assert ds.env_spec.id == "CartPole-v1" and meta["tdreplay_table"] == name
    assert meta["tdreplay_version"] and '"next.observation"' in meta["tdreplay_schema"]

    with pytest.raises(PathExists):
        client.export(name, format="minari", dest=root, dataset_id="tdreplay/run-v0")
    with pytest.raises(InvalidRequest, match="dataset_id"):
        client.export(name, format="minari", dest=root)

    copy = make_table(client)
    assert client.import_dataset(copy, "tdreplay/run-v0", root=root, chunk=5) == sum(LENGTHS)
    assert (
        pq.read_table(pa.BufferReader(client.export(copy))).to_pydict()
        == pq.read_table(pa.BufferReader(client.export(name))).to_pydict()
    )
    with pytest.raises(InvalidRequest, match=r"no Minari dataset 'tdreplay/nope-v0'.*run-v0"):
        client.import_dataset(copy, "tdreplay/nope-v0", root=root)
    narrow = make_table(client, fields={**FIELDS, "extra": {"shape": [2], "dtype": "float32"}})
    with pytest.raises(SchemaError, match="'extra' has no source"):
        client.import_dataset(narrow, "tdreplay/run-v0", root=root)
    with pytest.raises(ValueError, match="reads Minari datasets, not 'd4rl'"):
        client.import_dataset(copy, "tdreplay/run-v0", format="d4rl", root=root)


def test_minari_spaces_from_the_schema(
    client: ReplayClient, server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an env spec the dataset's spaces come from the table's schema (a scalar
    integer action declaring n categories: Discrete), and every step lies in them; a
    value outside the categories never gets in (the extend is refused, nothing written),
    so the export's own check of every row (``tests/test_codec_episodes.py``) finds none."""
    from gymnasium import spaces

    fields = {**FIELDS, "action": {"shape": [], "dtype": "int64", "n": 4}}
    name = make_table(client, fields=fields)
    assert client.info(name)["fields"]["action"] == {"shape": [], "dtype": "int64", "n": 4}
    assert "n" not in client.info(name)["fields"]["observation"]
    rows = transitions(LENGTHS)
    rows["action"] = torch.arange(len(rows)) % 4
    client.extend(name, rows)
    root = tmp_path / "datasets"
    client.export(name, format="minari", dest=root, dataset_id="tdreplay/spaces-v0")
    ds = load(root, "tdreplay/spaces-v0", monkeypatch)
    assert ds.env_spec is None
    assert ds.action_space == spaces.Discrete(4)
    assert ds.observation_space == spaces.Box(-np.inf, np.inf, (3,), np.float32)
    assert contains_every_step(ds) == sum(LENGTHS)
    assert ds[1].actions.tolist() == [3, 0, 1, 2, 3]

    size = client.info(name)["size"]
    bad = rows[:1].clone()
    bad["action"] = torch.tensor([4])
    with pytest.raises(InvalidRequest, match="'action' holds 4, outside its 4 categories") as e:
        client.extend(name, bad)
    assert e.value.field == "action" and client.info(name)["size"] == size
    for where in ({"dest": root}, {"path": "exports/minari"}):
        client.export(name, format="minari", dataset_id="tdreplay/again-v0", **where)
    assert hidden(root) == [] and hidden(server.root / "exports") == []


def test_minari_on_the_server(
    client: ReplayClient, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = make_table(
        client, sampler={"kind": "slice", "slice_len": 2, "traj_key": "traj", "end_key": None}
    )
    rows = transitions(LENGTHS)
    rows["next", "done"][:] = False  # the trajectory key alone cuts the episodes
    rows["next", "terminated"][:] = False
    client.extend(name, rows)
    where = client.export(name, "minari", path="exports/minari", dataset_id="srv/run-v0")
    assert where == "exports/minari/srv/run-v0"
    ds = load(server.root / "exports" / "minari", "srv/run-v0", monkeypatch)
    assert [len(e) for e in ds.iterate_episodes()] == LENGTHS
    assert [e.infos["traj"][0] for e in ds.iterate_episodes()] == [0, 1, 2, 3]
    with pytest.raises(PathExists):
        client.export(name, "minari", path="exports/minari", dataset_id="srv/run-v0")
    with pytest.raises(InvalidRequest, match="exports/"):
        client.export(name, "minari", path="checkpoints/x", dataset_id="srv/other-v0")
    with pytest.raises(InvalidRequest, match="dataset_id"):
        client.export(name, "minari", path="exports/minari", dataset_id="../../up-v0")

    flagless = make_table(client)  # done flags in the schema, none set in the rows
    client.extend(flagless, rows)
    with pytest.raises(SchemaError, match="no episode boundary found in 14 rows"):
        client.export(flagless, "minari", path="exports/minari", dataset_id="srv/none-v0")
    no_next = make_table(
        client, fields={k: v for k, v in FIELDS.items() if k != "next.observation"}
    )
    with pytest.raises(SchemaError, match=r"missing keys for episodes: next\.observation"):
        client.export(no_next, "minari", path="exports/minari", dataset_id="srv/none-v0")
    assert hidden(server.root / "exports") == []


def test_minari_from_the_command_line(
    client: ReplayClient,
    server: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("TDREPLAY_URL", "TDREPLAY_TOKEN", "TDREPLAY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    name = make_table(client)
    client.extend(name, transitions(LENGTHS))
    root = tmp_path / "datasets"
    url = ("--url", server.url)
    code, out, err = cli(
        "export", name, "--format", "minari", "--dataset-id", "cli/run-v0", "-o", str(root),
        "--env-spec", "CartPole-v1", *url, capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    assert "Minari dataset 'cli/run-v0'" in out
    assert load(root, "cli/run-v0", monkeypatch).env_spec.id == "CartPole-v1"
    copy = make_table(client)
    code, out, err = cli(
        "import", copy, str(root), "--format", "minari", "--dataset-id", "cli/run-v0", *url,
        capsys=capsys,
    )  # fmt: skip
    assert code == 0 and f"imported {sum(LENGTHS)} rows" in out, err
    code, _, err = cli("export", name, "--format", "minari", *url, capsys=capsys)
    assert code == 2 and "--dataset-id" in err
    code, _, err = cli(
        "import", copy, str(root), "--format", "minari", "--dataset-id", "cli/nope-v0", *url,
        capsys=capsys,
    )  # fmt: skip
    assert code == 1 and "no Minari dataset 'cli/nope-v0'" in err

    # offline: from a data root's checkpoint (no server), as the Parquet export does
    client.checkpoint(name, f"checkpoints/{name}")
    code, out, err = cli(
        "export", "--checkpoint", str(server.root / "checkpoints" / name), "--format", "minari",
        "--dataset-id", "cli/offline-v0", "-o", str(root), capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    ds = load(root, "cli/offline-v0", monkeypatch)
    assert [len(e) for e in ds.iterate_episodes()] == LENGTHS
    assert hidden(root) == []


def test_hugging_face_datasets_reads_a_parquet_export(
    client: ReplayClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    name = make_table(client)
    client.extend(name, transitions(LENGTHS))
    file = client.export(name, dest=tmp_path / "rows.parquet")
    ds = datasets.load_dataset(
        "parquet", data_files=str(file), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert ds.num_rows == sum(LENGTHS)
    assert {"observation", "next.observation", "next.reward", "next.done", "traj"} <= set(
        ds.column_names
    )
    assert ds[3]["next.observation"] == [1.0, 1.0, 0.0]  # episode 1, step 0 -> 1
    assert ds[3]["next.reward"] == [10.0] and ds[7]["next.done"] == [True]
    torch_rows = ds.with_format("torch")[0:3]
    assert torch_rows["observation"].shape == (3, 3)
