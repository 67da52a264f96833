"""The DQN throughput example: tdreplay's buffer against TorchRL's in one run, as entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from example_kit import run

#: an example run in processes of its own: make test-long, not make test
pytestmark = pytest.mark.slow


def test_dqn_throughput_smoke(tmp_path: Path) -> None:
    path = tmp_path / "throughput.json"
    args = ["--seconds", "0.5", "--rounds", "1", "--init-frames", "200", "--json", str(path)]
    run("dqn/throughput.py", *args)
    entries = json.loads(path.read_text())
    assert {e["workload"].split(",")[0] for e in entries} == {
        "cartpole sample b128",
        "cartpole sample b128 + DQN step",
    }
    for e in entries:
        assert set(e) == {
            "bench",
            "workload",
            "value",
            "unit",
            "baseline",
            "baseline_value",
            "ratio",
            "goal",
            "pass",
        }
        assert e["value"] > 0 and e["baseline_value"] > 0
