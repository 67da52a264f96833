"""The README's quickstart runs as written, and again on the data its first run left."""

from __future__ import annotations

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
