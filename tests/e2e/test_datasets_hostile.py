"""Minari datasets made elsewhere, wrong for the table they are imported into, against a real
server: a value the field's dtype cannot hold (a float action into an integer field, 300 into
uint8, a finite float beyond float32's range) or an episode whose parts disagree in length is
refused with an error naming the episode and the field, and the table gets none of it. The
datasets are written by Minari's own writer, as any tool that makes them would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import minari
import numpy as np
import pytest
from datasetkit import make_table
from testkit import run_cli as cli

from tdreplay.client import InvalidRequest, ReplayClient, SchemaError

FIELDS = {
    "observation": {"shape": [2], "dtype": "float32"},
    "action": {"shape": [], "dtype": "int64"},
    "next.observation": {"shape": [2], "dtype": "float32"},
    "next.reward": {"shape": [1], "dtype": "float32"},
    "next.done": {"shape": [1], "dtype": "bool"},
}
OBS = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)


def write(
    root: Path,
    dataset_id: str,
    episodes: list[dict[str, Any]],
    *,
    data_format: str = "hdf5",
    **spaces: Any,
) -> None:
    """The episodes as a Minari dataset in ``data_format``, through Minari's writer."""
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    (root / dataset_id).mkdir(parents=True)
    storage = MinariStorage.new(
        root / dataset_id / "data",
        observation_space=spaces.get("observation_space", OBS),
        action_space=spaces.get("action_space", gym.spaces.Discrete(3)),
        data_format=data_format,
    )
    storage.update_metadata({"dataset_id": dataset_id, "minari_version": minari.__version__})
    storage.update_episodes([EpisodeBuffer(**e) for e in episodes])


def episode(steps: int, **given: Any) -> dict[str, Any]:
    """An episode of ``steps`` steps, ending terminated; ``given`` replaces its parts."""
    parts = {
        "observations": np.arange((steps + 1) * 2, dtype=np.float64).reshape(steps + 1, 2),
        "actions": np.arange(steps) % 3,
        "rewards": np.ones(steps),
        "terminations": np.arange(steps) == steps - 1,
        "truncations": np.zeros(steps, bool),
        "infos": {},
    }
    return parts | given


CASES = {
    "float actions into int64": (
        {"actions": np.array([0.0, 0.7, 1.0])},
        {"action_space": gym.spaces.Box(-2.0, 2.0, (), np.float64)},
        {},
        r"'action' \(int64\) cannot hold 0.7 of episode 0 \(step 1, float64\)",
    ),
    "300 into uint8": (
        {"observations": np.array([[1, 2], [300, 4], [5, 6], [7, 8]])},
        {"observation_space": gym.spaces.Box(-1000, 1000, (2,), np.int64)},
        {
            "observation": {"shape": [2], "dtype": "uint8"},
            "next.observation": {"shape": [2], "dtype": "uint8"},
        },
        r"'observation' \(uint8\) cannot hold 300 of episode 0 \(step 1, int64\)",
    ),
    "1e39 into float32": (
        {"observations": np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 1e39], [7.0, 8.0]])},
        {},
        {},
        r"'observation' \(float32\) cannot hold 1e\+39 of episode 0 \(step 2, float64\)",
    ),
    "more observations than steps + 1": (
        {"observations": np.zeros((7, 2))},
        {},
        {},
        r"episode 0 has 7 observations \(observation\) for its 3 steps \(rewards\); expected 4",
    ),
    "more actions than steps": (
        {"actions": np.array([0, 1, 2, 0, 1])},
        {},
        {},
        r"episode 0 has 5 actions \(action\) for its 3 steps \(rewards\); expected 3",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_dataset_the_table_cannot_hold_is_refused(
    client: ReplayClient, tmp_path: Path, case: str
) -> None:
    given, spaces, fields, message = CASES[case]
    write(tmp_path, "elsewhere/bad-v0", [episode(3, **given)], **spaces)
    name = make_table(client, fields=FIELDS | fields)
    with pytest.raises(SchemaError, match=message):
        client.import_dataset(name, "elsewhere/bad-v0", root=tmp_path)
    assert client.info(name)["size"] == 0


def test_values_that_fit_go_in_as_they_are(client: ReplayClient, tmp_path: Path) -> None:
    """Integral floats into an integer field, int64 that fits uint8, float64 rounded into
    float32: what a careful dataset holds is taken, values unchanged but the rounding."""
    obs = np.array([[0, 255], [1, 2], [3, 4]])
    write(
        tmp_path,
        "elsewhere/good-v0",
        [episode(2, observations=obs, actions=np.array([2.0, 0.0]), rewards=np.array([0.1, 1e30]))],
        observation_space=gym.spaces.Box(0, 255, (2,), np.int64),
        action_space=gym.spaces.Box(0.0, 2.0, (), np.float64),
    )
    fields = {
        "observation": {"shape": [2], "dtype": "uint8"},
        "next.observation": {"shape": [2], "dtype": "uint8"},
    }
    name = make_table(client, fields=FIELDS | fields)
    assert client.import_dataset(name, "elsewhere/good-v0", root=tmp_path) == 2
    rows = client.sample(name, 64)  # uniform: every row of two, drawn
    by_action = {int(a): i for i, a in enumerate(rows["action"].tolist())}
    first = rows[by_action[2]]
    assert first["observation"].tolist() == [0, 255] and first["next", "observation"].tolist() == [
        1,
        2,
    ]
    assert rows[by_action[0]]["next", "reward"].item() == np.float32(1e30)


def broken(root: Path, how: str) -> str:
    """A Minari dataset broken as a copy cut short or edited by hand leaves it."""
    import h5py

    dataset_id = f"elsewhere/{how}-v0"
    write(root, dataset_id, [episode(2)])
    data = root / dataset_id / "data"
    if how == "no-metadata-key":
        (data / "metadata.json").write_text('{"minari_version": "0.5.4"}')
    elif how == "metadata-not-json":
        (data / "metadata.json").write_text("{not json")
    else:
        with h5py.File(data / "main_data.hdf5", "a") as f:
            del f["episode_0"]["rewards"]
    return dataset_id


@pytest.mark.parametrize("how", ["no-metadata-key", "metadata-not-json", "episode-lacks-rewards"])
def test_a_broken_dataset_is_one_line_and_exit_1(
    server: Any, client: ReplayClient, tmp_path: Path, how: str, capsys: Any, monkeypatch: Any
) -> None:
    dataset_id = broken(tmp_path, how)
    name = make_table(client, fields=FIELDS)
    code, _, err = cli(
        "import", name, "--format", "minari", "--dataset-id", dataset_id, str(tmp_path),
        capsys=capsys, monkeypatch=monkeypatch, TDREPLAY_URL=server.url,
    )  # fmt: skip
    assert code == 1 and "Traceback" not in err
    assert f"{dataset_id!r} under {str(tmp_path)!r} is not a readable Minari dataset" in err
    assert client.info(name)["size"] == 0


def test_an_export_into_a_folder_is_refused_before_the_transfer(
    server: Any, client: ReplayClient, tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """``-o`` naming a folder: the whole table was streamed into a hidden file beside it and
    the rename failed at the end, with an IsADirectoryError naming that hidden file."""
    name = make_table(client, fields=FIELDS)
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(InvalidRequest, match=rf"export path {str(folder)!r} is a folder"):
        client.export(name, dest=folder)
    code, _, err = cli(
        "export", name, "-o", str(folder), capsys=capsys, monkeypatch=monkeypatch,
        TDREPLAY_URL=server.url,
    )  # fmt: skip
    assert code == 1 and f"export path {str(folder)!r} is a folder" in err
    assert list(tmp_path.rglob("*")) == [folder]


def test_an_import_longer_than_a_small_table_keeps_its_newest_rows(
    server: Any, client: ReplayClient, tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """The client read 4096 rows per extend (the default chunk) whatever the table's
    capacity: any file or dataset longer than a table of fewer rows failed (``extend of 20
    rows exceeds capacity 8``), where ``Table.import_parquet`` kept the newest rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fields = {"x": {"shape": [2], "dtype": "float32"}}
    path = tmp_path / "long.parquet"
    pq.write_table(pa.table({"x": [[float(i), -float(i)] for i in range(20)]}), path)
    name = make_table(client, fields=fields, capacity=8)
    assert client.import_parquet(name, path) == 20
    code, out, _ = cli(
        "import", name, str(path), capsys=capsys, monkeypatch=monkeypatch, TDREPLAY_URL=server.url
    )
    assert code == 0 and "imported 20 rows" in out
    kept = pq.read_table(pa.BufferReader(client.export(name)))["x"].to_pylist()
    assert kept == [[float(i), -float(i)] for i in range(12, 20)]

    write(tmp_path, "elsewhere/long-v0", [episode(6), episode(7)])
    small = make_table(client, fields=FIELDS, capacity=8)
    assert client.import_dataset(small, "elsewhere/long-v0", root=tmp_path) == 13
    assert client.info(small)["size"] == 8
