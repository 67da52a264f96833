"""The README's quickstart runs as written, and again on the data its first run left."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_quickstart_runs_twice(tmp_path: Path) -> None:
    text = (REPO / "README.md").read_text()
    block = re.search(
        r"## Quickstart: a table in your own process\n\n```python\n(.*?)```", text, re.S
    )
    assert block, "the README has no quickstart block"
    (tmp_path / "quickstart.py").write_text(block.group(1))
    shutil.copytree(REPO / "schemas", tmp_path / "schemas")
    for run in range(2):  # the second run reopens the table the first one left
        done = subprocess.run(
            [sys.executable, "quickstart.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (run, done.stdout[-2000:], done.stderr[-4000:])
    assert (tmp_path / "tdreplay-data" / "tables" / "cartpole" / "storage").is_dir()


def test_the_raw_arrow_snippet_runs_against_a_server(live_server, tmp_path: Path) -> None:
    """The README's "any Arrow client works" block, as written, against a server with a token."""
    text = (REPO / "README.md").read_text()
    block = re.search(
        r"```python\n(import http\.client, json, os, pyarrow as pa.*?)```", text, re.S
    )
    assert block, "the README has no raw-Arrow block"
    token = "readme-snippet-token-0123456789"
    server = live_server(token=token)
    code = block.group(1).replace('("127.0.0.1", 8000)', f'("127.0.0.1", {server.port})')
    assert code != block.group(1), "the snippet no longer connects to 127.0.0.1:8000"
    (tmp_path / "snippet.py").write_text(code + "\nprint(sampled.num_rows)\n")
    env = {**os.environ, "TDREPLAY_TOKEN": token}
    outputs = []
    for _ in range(2):  # the second run finds the table: 409, and goes on
        done = subprocess.run(
            [sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(done.stdout.split("\n"))
    assert outputs[0][0] == "201" and outputs[1][0] == "409"
    assert outputs[0][1] == "{'index': [0, 1], 'rows': 2}"
    assert outputs[1][2] == "32"  # sampled after the second extend: 4 rows, 32 draws


def test_the_datasets_snippet_runs_against_a_server(live_server, tmp_path: Path) -> None:
    """The README's Minari block, as written, in a fresh folder: its datasets root is the
    relative ``./datasets`` (Minari failed to write under a relative folder: 'datasets/tdreplay/
    .cp-v0.tmp-.../data/datasets/tdreplay/.cp-v0.tmp-.../data/main_data.hdf5' No such file),
    and ``cartpole2`` is made as the README says, by ``tdreplay create cartpole --name``."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"```python\n(import os\n\nimport minari\n.*?)```", text, re.S)
    assert block, "the README has no Minari block"
    server = live_server("--schema", "schemas/cartpole.yaml", backend="memory")
    made = subprocess.run(
        [sys.executable, "-m", "tdreplay.cli", "create", "cartpole", "--name", "cartpole2"],
        env={**os.environ, "TDREPLAY_URL": server.url},
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0 and "created table 'cartpole2'" in made.stdout, made.stderr
    prelude = (
        "from torchrl.collectors import Collector\n"
        "from torchrl.envs import GymEnv\n"
        "from tdreplay.client import ReplayClient\n\n"
        f"client = ReplayClient({server.url!r})\n"
        "rollouts = Collector(GymEnv('CartPole-v1'), policy=None, frames_per_batch=200, "
        "total_frames=400)\n"
        "for td in rollouts:\n"
        "    client.extend('cartpole', td)\n"
    )
    after = "\nprint(ds.total_steps, client.info('cartpole2')['size'])\n"
    (tmp_path / "snippet.py").write_text(prelude + block.group(1) + after)
    done = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split()[-2:] == ["400", "400"], done.stdout[-2000:]
    assert (tmp_path / "datasets" / "tdreplay" / "cp-v0" / "data").is_dir()
    assert (server.root / "exports" / "minari" / "tdreplay" / "cp-v0" / "data").is_dir()
