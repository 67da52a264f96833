"""``bench/gpu_check.py`` (issue 24 item 6): its logic runs here on a CPU "device"; on a
machine with CUDA the suite runs it on the GPU too; without CUDA it says it did not run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from testkit import REPO

#: the check script in processes of its own: make test-long, not make test
pytestmark = pytest.mark.slow

SCRIPT = REPO / "bench" / "gpu_check.py"


def run_check(tmp_path: Path, *args: str, timeout: float) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(out)],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout, json.loads(out.read_text())


def test_the_gpu_check_runs_on_a_cpu_device(tmp_path: Path) -> None:
    """Every check of the script, with a CPU "device": the writer's rows, the same draws
    through loader(device) and loader() over HTTP, shm and the stream route, the learner's
    next(); and its figures, as entries."""
    _, result = run_check(tmp_path, "--device", "cpu", "--quick", timeout=180)
    checks = result["checks"]
    ways = ("http", "shm", "http stream")
    names = ["writer", *(f"identical {w}" for w in ways), *(f"never blocks {w}" for w in ways)]
    assert sorted(checks) == sorted(names), checks
    for name in names:
        assert checks[name]["pass"] is True, (name, checks[name])
    assert all(checks[f"identical {w}"]["leaves_on_device"] for w in ways)
    workloads = [e["workload"] for e in result["entries"]]
    assert len(workloads) == 4 and all(e["value"] > 0 for e in result["entries"]), workloads
    assert result["ok"] and result["device"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: the GPU test runs instead")
def test_without_cuda_it_says_it_did_not_run(tmp_path: Path) -> None:
    stdout, result = run_check(tmp_path, timeout=60)
    assert "not run on a GPU" in stdout
    assert result["skipped"] and result["entries"] == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA: not run on a GPU")
def test_the_gpu_check_passes_on_cuda(tmp_path: Path) -> None:
    stdout, result = run_check(tmp_path, timeout=600)
    assert result["ok"], stdout
    assert result["device"].startswith("cuda") and result["gpu"]
    assert all(check["pass"] is not False for check in result["checks"].values()), stdout
