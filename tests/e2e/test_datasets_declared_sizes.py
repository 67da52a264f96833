"""A Minari HDF5 file of a few KB declaring an episode of millions of steps (datasets never
written: HDF5 reads them as zeros) against a real server: the importing process read each
episode whole through Minari, so a 7 KB file took it to 814 MB before the first chunk was
sent (500M steps: 80 GB). Now an episode is read a chunk at a time and a file whose
episodes disagree with its metadata's ``total_steps`` is refused before a value is read.
The import runs in a fresh process (the client, and the ``tdreplay import`` command) whose
peak resident memory is measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import h5py
import numpy as np
from datasetkit import make_table
from test_datasets_hostile import FIELDS, episode, write
from testkit import PEAK

from tdreplay.client import ReplayClient

STEPS = 2_000_000  # Minari's whole episode and its rows: ~200 MB; a chunk: ~1 MB
CHUNK = 4096
#: the import's peak memory above the process's before it; the whole episode is ~200 MB
GROWTH_MB = 60
#: a fresh process: the memory it peaks at importing, above what it held before
MEASURE = (
    PEAK
    + """
import json, sys
from tdreplay.client import ReplayClient
from tdreplay.cli import main
url, how, table, dataset_id, root = sys.argv[1:6]
client = ReplayClient(url)
client.info(table)
before = reset_peak()
try:
    if how == "client":
        print(client.import_dataset(table, dataset_id, root=root, chunk=int(sys.argv[6])))
    else:
        main(["import", table, "--url", url, "--format", "minari", "--dataset-id", dataset_id, root])
    error = None
except BaseException as err:
    error = f"{type(err).__name__}: {err}"
grown = peak_growth(before) / (1 << 20)
print(json.dumps({"grown_mb": grown, "error": error}), file=sys.stderr)
"""
)


def bomb(root: Path, dataset_id: str, *, steps: int, total_steps: int) -> Path:
    """A dataset whose one episode declares ``steps`` steps, none written, and whose
    metadata says ``total_steps``; returns its HDF5 file."""
    write(root, dataset_id, [episode(3)], observation_space=gym.spaces.Box(-1, 1, (2,)))
    data = root / dataset_id / "data"
    with h5py.File(data / "main_data.hdf5", "a") as f:
        group = f["episode_0"]
        for name, extra, dtype in [
            ("observations", 1, np.float32),
            ("actions", 0, np.int64),
            ("rewards", 0, np.float64),
            ("terminations", 0, np.bool_),
            ("truncations", 0, np.bool_),
        ]:
            del group[name]
            shape = (steps + extra, 2) if name == "observations" else (steps + extra,)
            group.create_dataset(name, shape=shape, dtype=dtype, chunks=True)
        group.attrs["total_steps"] = steps
    metadata = json.loads((data / "metadata.json").read_text())
    (data / "metadata.json").write_text(json.dumps(metadata | {"total_steps": total_steps}))
    return data / "main_data.hdf5"


def measured(server: Any, how: str, table: str, dataset_id: str, root: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, server.url, how, table, dataset_id, str(root), str(CHUNK)],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("TDREPLAY_")},
    )
    return json.loads(done.stderr.strip().splitlines()[-1]) | {
        "stdout": done.stdout,
        "stderr": done.stderr,
    }


def refused_before_reading(
    server: Any, client: ReplayClient, root: Path, dataset_id: str, said: str
) -> None:
    """The import of ``dataset_id`` (its metadata's ``total_steps`` 3), through the client
    and the CLI, is refused saying ``said``, memory growth under ``GROWTH_MB``; nothing lands."""
    name = make_table(client, fields=FIELDS)
    for how in ("client", "cli"):
        got = measured(server, how, name, dataset_id, root)
        assert got["error"] is not None, got  # the CLI's: SystemExit, its message on stderr
        assert said in got["stderr"], got
        assert "metadata.json's total_steps is 3" in got["stderr"]
        assert got["grown_mb"] < GROWTH_MB, got
    assert client.info(name)["size"] == 0


def test_a_file_declaring_more_steps_than_its_metadata_is_refused_before_reading(
    server: Any, client: ReplayClient, tmp_path: Path
) -> None:
    path = bomb(tmp_path, "elsewhere/bomb-v0", steps=STEPS, total_steps=3)
    assert path.stat().st_size < 64 * 1024
    said = f"{path}: its 1 episodes hold {STEPS} steps (the longest, episode_0: {STEPS})"
    refused_before_reading(server, client, tmp_path, "elsewhere/bomb-v0", said)


def test_a_long_episode_is_read_a_chunk_at_a_time(
    server: Any, client: ReplayClient, tmp_path: Path
) -> None:
    """Its metadata agreeing, the episode goes in whole: memory follows the chunk."""
    bomb(tmp_path, "elsewhere/long-v0", steps=STEPS, total_steps=STEPS)
    name = make_table(client, fields=FIELDS, capacity=CHUNK)
    got = measured(server, "client", name, "elsewhere/long-v0", tmp_path)
    assert got["error"] is None and got["stdout"].split() == [str(STEPS)], got
    assert got["grown_mb"] < GROWTH_MB, got
    assert client.info(name)["size"] == CHUNK
