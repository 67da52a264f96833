"""examples/stats/log_stats.py in its short mode: it logs client.stats with TorchRL's CSVLogger."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from testkit import REPO

#: an example run in processes of its own: make test-long, not make test
pytestmark = pytest.mark.slow


def test_log_stats_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "examples/stats/log_stats.py"), "--smoke"]
    proc = subprocess.run(
        [*cmd, "--log-dir", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 40: size" in proc.stdout
    logged = tmp_path / "replay-stats" / "scalars" / "buffer"
    rows = (logged / "samples_per_insert.csv").read_text().splitlines()
    assert len(rows) == 4 and all(float(r.split(",")[1]) > 0 for r in rows)
    assert (logged / "priority_max.csv").exists() and (logged / "blocked_sample_s.csv").exists()
