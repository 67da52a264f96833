"""The learning-parity example: both buffers, a few seeds, the curves and Welch's test."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from example_kit import REPO, run

#: an example run in processes of its own: make test-long, not make test
pytestmark = pytest.mark.slow


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
