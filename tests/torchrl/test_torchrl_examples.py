"""Each example runs with one command; here in its short mode, each starting its own server.

The longer runs have files of their own (``test_torchrl_example_sota.py``,
``test_torchrl_example_parity.py``, ``test_torchrl_example_throughput.py``), so that the
suite's workers, which take whole files, share them out.
"""

from __future__ import annotations

import runpy
import sys

import pytest
from example_kit import REPO, run

#: an example run in processes of its own: make test-long, not make test
pytestmark = pytest.mark.slow


def test_dqn_smoke() -> None:
    out = run("dqn/train.py", "--smoke")
    assert "frames" in out and "samples/s" in out


def test_offline_smoke() -> None:
    out = run("offline/bc.py", "--smoke")
    assert "TensorDict.from_parquet: batch [1000]" in out
    assert "behaviour clone's average return" in out


def test_tensorclass_smoke() -> None:
    out = run("tensorclass/transitions.py", "--smoke")
    assert "500 transitions stored" in out
    assert "sampled Transition: obs (64, 4)" in out


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
