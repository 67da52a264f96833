"""What the example tests share: running an example script in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

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
