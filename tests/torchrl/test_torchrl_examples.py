"""Each example runs with one command; here in its short mode, each starting its own server."""

from __future__ import annotations

import json
import math
import os
import runpy
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tdreplay.client import ReplayClient

REPO = Path(__file__).resolve().parents[2]


def run(script: str, *args: str, timeout: float = 240) -> str:
    # TorchRL's LazyTensorStorage(shared_init=True) leaves a folder in the temp dir: this one goes
    with tempfile.TemporaryDirectory(prefix="tdreplay-example-tmp-") as scratch:
        proc = subprocess.run(
            [sys.executable, str(REPO / "examples" / script), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            env={**os.environ, "TMPDIR": scratch},
        )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_dqn_smoke() -> None:
    out = run("dqn/train.py", "--smoke")
    assert "frames" in out and "samples/s" in out


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


def test_offline_smoke() -> None:
    out = run("offline/bc.py", "--smoke")
    assert "TensorDict.from_parquet: batch [1000]" in out
    assert "behaviour clone's average return" in out


def test_tensorclass_smoke() -> None:
    out = run("tensorclass/transitions.py", "--smoke")
    assert "500 transitions stored" in out
    assert "sampled Transition: obs (64, 4)" in out


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


def test_learning_parity_smoke(tmp_path: Path) -> None:
    """Both buffers x 2 seeds of a few hundred frames, the curves, the late returns and
    Welch's test in the JSON; its own server, stopped at the end."""
    path, png = tmp_path / "parity.json", tmp_path / "parity.png"
    out = run("torchrl/learning_parity.py", "--smoke", "--json", str(path), "--png", str(png))
    assert "Welch t = " in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads(path.read_text())
    assert result["config"]["seeds"] == 2 and result["config"]["frames"] == 400
    runs = result["runs"]
    assert sorted((r["buffer"], r["seed"]) for r in runs) == [
        ("tdreplay", 0),
        ("tdreplay", 1),
        ("torchrl", 0),
        ("torchrl", 1),
    ]
    for r in runs:
        assert r["frames"] == 400 and r["rows"] == 400 and r["episodes"]
        assert all(0 < f <= 400 and ret >= 1 for f, ret in r["episodes"])
    for buffer in ("torchrl", "tdreplay"):
        assert len(result["curves"][buffer]["mean"]) == len(result["curves"]["frames"]) == 4
        assert result["summary"][buffer]["n"] == 2
    assert set(result["summary"]["welch"]) == {"t", "df", "p"}


def test_welch_and_t_quantiles() -> None:
    """The t distribution without scipy: known quantiles and a Welch test worked by hand."""
    sys.path.insert(0, str(REPO / "examples" / "torchrl"))
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import learning_parity as lp
    finally:
        sys.path.remove(str(REPO / "examples" / "torchrl"))
        sys.path.remove(str(REPO / "examples"))
    assert lp.t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert lp.t_quantile(0.975, 30) == pytest.approx(2.0423, abs=1e-4)
    assert lp.t_two_sided_p(2.0, 10) == pytest.approx(0.07339, abs=1e-5)
    w = lp.welch([1, 2, 3, 4, 5], [2, 4, 6, 8, 11])
    # variances of the means 2.5 / 5 and 12.2 / 5
    assert w["t"] == pytest.approx(-3.2 / math.sqrt(0.5 + 2.44))
    assert w["df"] == pytest.approx(2.94**2 / (0.5**2 / 4 + 2.44**2 / 4))
    assert 0.1 < w["p"] < 0.12
    mean, half = lp.mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.3027 / math.sqrt(3), abs=1e-4)


@pytest.mark.parametrize(
    "script",
    [
        "dqn/train.py",
        "dqn/throughput.py",
        "offline/bc.py",
        "torchrl/dqn_sota.py",
        "torchrl/learning_parity.py",
    ],
)
def test_help(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` in this process: the script as ``__main__`` (torch is imported already)."""
    path = REPO / "examples" / script
    argv, sys.argv = sys.argv, [str(path), "--help"]
    sys.path.insert(0, str(path.parent))  # a script imports its siblings
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv = argv
        sys.path.remove(str(path.parent))
    assert done.value.code == 0
    assert "--url" in capsys.readouterr().out
