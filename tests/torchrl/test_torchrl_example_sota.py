"""The sota-style DQN example: trains, checkpoints its run with the buffer, and resumes."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from example_kit import run

from tdreplay.client import ReplayClient

#: an example run in processes of its own: make test-long, not make test
pytestmark = pytest.mark.slow


def test_dqn_sota_trains_checkpoints_and_resumes(
    server: Any, live_server: Callable[..., Any], tmp_path: Path
) -> None:
    """The sota-style script trains a few hundred frames, checkpoints its run (buffer
    included), and a second run resumes from it on a fresh server and goes on."""
    out = tmp_path / "run"
    common = ["--out", str(out), "--init-frames", "200", "--save-every", "300"]
    first = run("torchrl/dqn_sota.py", "--url", server.url, "--frames", "400", *common)
    assert "frames 400  buffer 400  updates 30" in first
    with ReplayClient(server.url) as client:
        info = client.info("dqn_sota")
    assert info["size"] == info["inserts"] == 400 and info["sampler"]["kind"] == "prioritized"
    saved = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert saved == ["checkpoint-000000000300", "checkpoint-000000000400"]
    parts = {p.name for p in (out / "checkpoints" / saved[-1] / "components").iterdir()}
    assert {"0000-loss", "0001-optim", "0002-replay_buffer", "0003-rng"} <= parts

    fresh = live_server()  # another server: the checkpoint brings the table with it
    second = run("torchrl/dqn_sota.py", "--url", fresh.url, "--frames", "700", "--resume", *common)
    assert f"resumed from {out / 'checkpoints' / saved[-1]} at 400 frames" in second
    assert "frames 700  buffer 700  updates 30" in second
    with ReplayClient(fresh.url) as client:
        assert client.info("dqn_sota")["inserts"] == 700
    log = (out / "logs" / "dqn" / "scalars" / "train" / "q_loss.csv").read_text().split()
    steps = [int(line.split(",")[0]) for line in log]
    values = [float(line.split(",")[1]) for line in log]
    assert steps == [200, 300, 400, 500, 600, 700]  # one log, the resumed run goes on in it
    assert all(math.isfinite(v) for v in values)
