"""Minari's Parquet format (one Parquet file per episode) made elsewhere, against a real server.

A Parquet file's pages may be dictionary- or run-length-encoded and compressed: a few KB
can hold millions of rows of zeros, and Minari's reader decoded each episode whole (then
stacked its rows as Python objects), so the importing process grew by hundreds of MB
before its first chunk was sent. Now the steps are counted from the files' footers and
checked against the metadata, the widths from the schema against the table, and every
page's size from its header, all before a value is read; values are read a chunk at a
time. An honest dataset imports exactly what Minari's ``iterate_episodes`` yields. The
import runs in a fresh process whose peak resident memory is measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import minari
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasetkit import make_table
from test_datasets_arrow import OBS, declare_steps, small, zeros
from test_datasets_declared_sizes import GROWTH_MB, measured, refused_before_reading
from test_datasets_hostile import FIELDS, write

from tdreplay.client import InvalidRequest, ReplayClient, SchemaError

STEPS = 8_000_000  # rows of zeros: ~210 MB decoded; a few KB of dictionary-encoded zstd
LONG = 2_000_000  # an honest long episode, imported


def bomb(
    root: Path, dataset_id: str, *, rows: int, total_steps: int, width: int = 2, **how: Any
) -> Path:
    """A dataset whose one episode is a Parquet file of ``rows`` rows of zeros (``width``
    observation values a step; ``how``: ``pq.write_table``'s options, default dictionary
    pages and zstd), its metadata saying ``total_steps``; returns the file."""
    write(root, dataset_id, [small(3)], data_format="parquet", observation_space=OBS)
    data = root / dataset_id / "data"
    path = data / "0" / "part-0.parquet"
    table = pa.table(zeros(rows, width))
    pq.write_table(table, path, **({"compression": "zstd", "row_group_size": rows} | how))
    declare_steps(data, rows - 1, total_steps)
    return path


def test_a_file_holding_more_steps_than_its_metadata_is_refused_before_reading(
    server: Any, client: ReplayClient, tmp_path: Path
) -> None:
    path = bomb(tmp_path, "elsewhere/bomb-v0", rows=STEPS + 1, total_steps=3)
    assert path.stat().st_size < 256 * 1024
    said = f"{path.parent.parent}: its 1 episodes hold {STEPS} steps"
    refused_before_reading(server, client, tmp_path, "elsewhere/bomb-v0", said)


def test_a_long_episode_is_read_a_chunk_at_a_time(
    server: Any, client: ReplayClient, tmp_path: Path
) -> None:
    """Its metadata agreeing, one row group of dictionary pages goes in whole: memory
    follows the chunk, not the row group."""
    path = bomb(tmp_path, "elsewhere/long-v0", rows=LONG + 1, total_steps=LONG)
    assert path.stat().st_size < 256 * 1024
    name = make_table(client, fields=FIELDS, capacity=4096)
    got = measured(server, "client", name, "elsewhere/long-v0", tmp_path)
    assert got["error"] is None and got["stdout"].split() == [str(LONG)], got
    assert got["grown_mb"] < GROWTH_MB, got
    assert client.info(name)["size"] == 4096


def test_a_page_past_max_batch_bytes_is_refused_before_it_is_decompressed(
    server: Any, client: ReplayClient, tmp_path: Path
) -> None:
    """Its metadata agreeing, one zstd page of ~40 MB of zeros (pyarrow decompresses a page
    whole) is refused from its header, naming the flag; raised, it imports."""
    rows = 5_000_000
    path = bomb(
        tmp_path,
        "elsewhere/page-v0",
        rows=rows + 1,
        total_steps=rows,
        use_dictionary=False,
        data_page_size=1 << 30,
        write_batch_size=rows + 1,
        max_rows_per_page=rows + 1,
    )
    assert path.stat().st_size < 256 * 1024
    name = make_table(client, fields=FIELDS, capacity=4096)
    got = measured(server, "client", name, "elsewhere/page-v0", tmp_path)
    assert f"{path}: row group 0's largest pages, one per column, decompress to" in got["stderr"]
    assert "more than max_batch_bytes=33554432 (tdreplay import --max-batch-bytes)" in got["stderr"]
    assert got["grown_mb"] < GROWTH_MB, got
    assert client.info(name)["size"] == 0
    written = client.import_dataset(
        name, "elsewhere/page-v0", root=tmp_path, max_batch_bytes=128 << 20
    )
    assert written == rows and client.info(name)["size"] == 4096


def test_a_step_wider_than_the_field_is_refused_before_it_is_read(
    client: ReplayClient, tmp_path: Path
) -> None:
    bomb(tmp_path, "elsewhere/wide-v0", rows=101, total_steps=100, width=1_000_000)
    name = make_table(client, fields=FIELDS)
    with pytest.raises(SchemaError, match=r"'observation' has shape \[2\], but episode 0 holds"):
        client.import_dataset(name, "elsewhere/wide-v0", root=tmp_path)
    assert client.info(name)["size"] == 0


def test_an_honest_dataset_imports_what_minari_reads(client: ReplayClient, tmp_path: Path) -> None:
    """Several episodes, Dict observations with JPEG frames, Box actions, infos: row for row
    what ``iterate_episodes`` yields, a chunk cutting episodes."""
    rng = np.random.default_rng(0)
    obs_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-9e9, 9e9, (2,), np.float64),
            "pixels": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
        }
    )
    lengths = [3, 5, 1, 7]
    episodes = [
        {
            "observations": {
                "pos": np.arange((n + 1) * 2, dtype=np.float64).reshape(n + 1, 2) + e,
                "pixels": rng.integers(0, 256, (n + 1, 8, 8, 3), dtype=np.uint8),
            },
            "actions": np.arange(n * 2, dtype=np.float32).reshape(n, 2) / (e + 1),
            "rewards": np.arange(n) + 10.0 * e,
            "terminations": np.arange(n) == n - 1,
            "truncations": np.zeros(n, bool),
            "infos": {"speed": np.arange((n + 1) * 3, dtype=np.float32).reshape(n + 1, 3)},
        }
        for e, n in enumerate(lengths)
    ]
    write(
        tmp_path,
        "elsewhere/honest-v0",
        episodes,
        data_format="parquet",
        observation_space=obs_space,
        action_space=gym.spaces.Box(-9e9, 9e9, (2,), np.float32),
    )
    fields = {
        "observation.pos": {"shape": [2], "dtype": "float64"},
        "next.observation.pos": {"shape": [2], "dtype": "float64"},
        "observation.pixels": {"shape": [8, 8, 3], "dtype": "uint8"},
        "next.observation.pixels": {"shape": [8, 8, 3], "dtype": "uint8"},
        "action": {"shape": [2], "dtype": "float32"},
        "next.reward": {"shape": [1], "dtype": "float64"},
        "next.done": {"shape": [1], "dtype": "bool"},
        "speed": {"shape": [3], "dtype": "float32"},
        "traj": {"shape": [], "dtype": "int64"},
    }
    name = make_table(client, fields=fields, sampler={"kind": "fifo"})
    steps = sum(lengths)
    got_steps = client.import_dataset(
        name, "elsewhere/honest-v0", root=tmp_path, chunk=4, trajectory_key="traj"
    )
    assert got_steps == steps
    got = client.sample(name, steps)
    want = list(minari.MinariDataset(tmp_path / "elsewhere/honest-v0" / "data").iterate_episodes())
    assert [e.id for e in want] == list(range(len(lengths)))
    cat = np.concatenate
    for key in ("pos", "pixels"):
        assert (
            got["observation", key].tolist()
            == cat([e.observations[key][:-1] for e in want]).tolist()
        )
        assert (
            got["next", "observation", key].tolist()
            == cat([e.observations[key][1:] for e in want]).tolist()
        )
    assert got["action"].tolist() == cat([e.actions for e in want]).tolist()
    assert got["next", "reward"].reshape(-1).tolist() == cat([e.rewards for e in want]).tolist()
    done = cat([e.terminations | e.truncations for e in want])
    assert got["next", "done"].reshape(-1).tolist() == done.tolist()
    assert got["speed"].tolist() == cat([e.infos["speed"][:-1] for e in want]).tolist()
    assert got["traj"].tolist() == cat([[e.id] * len(e.rewards) for e in want]).tolist()


def test_a_link_out_of_the_dataset_is_refused(client: ReplayClient, tmp_path: Path) -> None:
    write(tmp_path, "elsewhere/link-v0", [small(3)], data_format="parquet", observation_space=OBS)
    outside = tmp_path / "outside.parquet"
    part = tmp_path / "elsewhere/link-v0" / "data" / "0" / "part-0.parquet"
    part.rename(outside)
    part.symlink_to(outside)
    name = make_table(client, fields=FIELDS)
    with pytest.raises(InvalidRequest, match="reaches outside its folder"):
        client.import_dataset(name, "elsewhere/link-v0", root=tmp_path)
    assert client.info(name)["size"] == 0
