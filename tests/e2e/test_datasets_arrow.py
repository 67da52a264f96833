"""Minari's Arrow format (one Arrow IPC file per episode) made elsewhere, against a real server.

An IPC file may compress its record batches: a few KB of zstd can hold millions of rows of
zeros, and Minari's reader decompressed each episode whole (then stacked its rows as Python
objects), so the importing process grew by hundreds of MB before its first chunk was sent.
Now the steps are counted from the files' message headers and checked against the metadata,
the widths from the schema against the table, and a compressed batch's size from its
buffers' headers, all before a value is read; values are read a chunk at a time. An honest
dataset imports exactly what Minari's ``iterate_episodes`` yields. The import runs in a
fresh process whose peak resident memory is measured.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import minari
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from datasetkit import make_table
from test_datasets_declared_sizes import GROWTH_MB, measured, refused_before_reading
from test_datasets_hostile import FIELDS, episode, write
from testkit import run_cli as cli

from tdreplay.client import AsyncReplayClient, InvalidRequest, ReplayClient, SchemaError

STEPS = 8_000_000  # rows of zeros: ~210 MB decompressed; ~30 KB of zstd
OBS = gym.spaces.Box(-1, 1, (2,), np.float32)


def small(steps: int) -> dict[str, Any]:
    """An honest episode of ``steps`` steps for an ``OBS`` space."""
    return episode(steps, observations=np.zeros((steps + 1, 2), np.float32))


def bomb(root: Path, dataset_id: str, *, rows: int, total_steps: int, width: int = 2) -> Path:
    """A dataset whose one episode is a zstd IPC file of ``rows`` rows of zeros (``width``
    observation values a step), its metadata saying ``total_steps``; returns the file."""
    write(root, dataset_id, [small(3)], data_format="arrow", observation_space=OBS)
    data = root / dataset_id / "data"
    path = data / "0" / "part-0.arrow"
    batch = pa.RecordBatch.from_pydict(zeros(rows, width))
    with ipc.new_file(path, batch.schema, options=ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_batch(batch)
    declare_steps(data, rows - 1, total_steps)
    return path


def zeros(rows: int, width: int) -> dict[str, Any]:
    """An episode's columns in Minari's Arrow/Parquet layout: ``rows`` rows of zeros,
    ``width`` observation values a row."""
    obs = pa.FixedSizeListArray.from_arrays(np.zeros(rows * width, np.float32), width)
    return {
        "observations": obs,
        "actions": np.zeros(rows, np.int64),
        "rewards": np.zeros(rows),
        "terminations": np.zeros(rows, bool),
        "truncations": np.zeros(rows, bool),
    }


def declare_steps(data: Path, steps: int, total_steps: int) -> None:
    """Episode 0's ``metadata.json`` says ``steps``, the dataset's says ``total_steps``."""
    for meta, n in [(data / "0" / "metadata.json", steps), (data / "metadata.json", total_steps)]:
        said = json.loads(meta.read_text())
        meta.write_text(json.dumps(said | {"total_steps": n}))


def test_a_file_holding_more_steps_than_its_metadata_is_refused_before_reading(
    server: Any, client: ReplayClient, tmp_path: Path
) -> None:
    path = bomb(tmp_path, "elsewhere/bomb-v0", rows=STEPS + 1, total_steps=3)
    assert path.stat().st_size < 256 * 1024
    said = f"{path.parent.parent}: its 1 episodes hold {STEPS} steps"
    refused_before_reading(server, client, tmp_path, "elsewhere/bomb-v0", said)


def test_a_compressed_batch_is_measured_before_it_is_decompressed(
    server: Any, client: ReplayClient, tmp_path: Path
) -> None:
    """Its metadata agreeing, a batch that decompresses to more than is read at a time is
    refused from its buffers' headers: pyarrow cannot decompress part of one."""
    path = bomb(tmp_path, "elsewhere/zip-v0", rows=STEPS + 1, total_steps=STEPS)
    name = make_table(client, fields=FIELDS)
    got = measured(server, "client", name, "elsewhere/zip-v0", tmp_path)
    assert f"{path}: record batch 0 of {STEPS + 1} rows decompresses to" in got["stderr"], got
    assert got["grown_mb"] < GROWTH_MB, got
    assert client.info(name)["size"] == 0


def test_max_batch_bytes_raised_imports_a_batch_refused_at_its_default(
    server: Any, client: ReplayClient, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The bound on a compressed batch is a setting: ``tdreplay import --max-batch-bytes``
    (in its ``--help``), ``max_batch_bytes=`` of both clients; the refusal names it."""
    rows = 1_500_000  # ~36 MB decompressed, past the default 32 MiB
    bomb(tmp_path, "elsewhere/big-v0", rows=rows + 1, total_steps=rows)
    name, other = make_table(client, fields=FIELDS), make_table(client, fields=FIELDS)
    argv = ("import", name, str(tmp_path), "--format", "minari", "--dataset-id", "elsewhere/big-v0")
    code, _, err = cli(*argv, "--url", server.url, capsys=capsys)
    assert (
        code == 1
        and "more than max_batch_bytes=33554432 (tdreplay import --max-batch-bytes)" in err
    )
    assert client.info(name)["size"] == 0
    code, _, err = cli(*argv, "--max-batch-bytes", "0", "--url", server.url, capsys=capsys)
    assert code == 2 and "--max-batch-bytes must be an integer >= 1, got 0" in err
    code, out, err = cli(
        *argv, "--max-batch-bytes", str(64 << 20), "--url", server.url, capsys=capsys
    )
    assert code == 0 and f"imported {rows} rows" in out, err
    assert client.info(name)["size"] == 100

    async def main() -> int:
        async with AsyncReplayClient(server.url) as aio:
            return await aio.import_dataset(
                other, "elsewhere/big-v0", root=tmp_path, max_batch_bytes=64 << 20
            )

    assert asyncio.run(main()) == rows and client.info(other)["size"] == 100
    code, out, _ = cli("import", "--help", capsys=capsys)
    assert code == 0 and "--max-batch-bytes BYTES" in out
    assert "(default: 33554432, 32 MiB)" in " ".join(out.split())


def test_a_step_wider_than_the_field_is_refused_before_it_is_read(
    client: ReplayClient, tmp_path: Path
) -> None:
    bomb(tmp_path, "elsewhere/wide-v0", rows=101, total_steps=100, width=1_000_000)
    name = make_table(client, fields=FIELDS)
    with pytest.raises(SchemaError, match=r"'observation' has shape \[2\], but episode 0 holds"):
        client.import_dataset(name, "elsewhere/wide-v0", root=tmp_path)
    assert client.info(name)["size"] == 0


def test_an_honest_dataset_imports_what_minari_reads(client: ReplayClient, tmp_path: Path) -> None:
    """Several episodes, Dict observations, Box actions, infos: row for row what
    ``iterate_episodes`` yields, a chunk cutting episodes."""
    obs_space = gym.spaces.Dict({"pos": gym.spaces.Box(-9e9, 9e9, (2,), np.float64)})
    lengths = [3, 5, 1, 7]
    episodes = [
        {
            "observations": {"pos": np.arange((n + 1) * 2, dtype=np.float64).reshape(n + 1, 2) + e},
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
        data_format="arrow",
        observation_space=obs_space,
        action_space=gym.spaces.Box(-9e9, 9e9, (2,), np.float32),
    )
    fields = {
        "observation.pos": {"shape": [2], "dtype": "float64"},
        "next.observation.pos": {"shape": [2], "dtype": "float64"},
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
    assert (
        got["observation", "pos"].tolist()
        == cat([e.observations["pos"][:-1] for e in want]).tolist()
    )
    assert (
        got["next", "observation", "pos"].tolist()
        == cat([e.observations["pos"][1:] for e in want]).tolist()
    )
    assert got["action"].tolist() == cat([e.actions for e in want]).tolist()
    assert got["next", "reward"].reshape(-1).tolist() == cat([e.rewards for e in want]).tolist()
    done = cat([e.terminations | e.truncations for e in want])
    assert got["next", "done"].reshape(-1).tolist() == done.tolist()
    assert got["speed"].tolist() == cat([e.infos["speed"][:-1] for e in want]).tolist()
    assert got["traj"].tolist() == cat([[e.id] * len(e.rewards) for e in want]).tolist()


def test_a_link_out_of_the_dataset_is_refused(client: ReplayClient, tmp_path: Path) -> None:
    write(tmp_path, "elsewhere/link-v0", [small(3)], data_format="arrow", observation_space=OBS)
    outside = tmp_path / "outside.arrow"
    part = tmp_path / "elsewhere/link-v0" / "data" / "0" / "part-0.arrow"
    part.rename(outside)
    part.symlink_to(outside)
    name = make_table(client, fields=FIELDS)
    with pytest.raises(InvalidRequest, match="reaches outside its folder"):
        client.import_dataset(name, "elsewhere/link-v0", root=tmp_path)
    assert client.info(name)["size"] == 0
