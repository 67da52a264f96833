"""Learning parity: ``dqn_sota.py`` with TorchRL's in-process ``TensorDictReplayBuffer``
and with ``TDReplayBuffer``, over seeds, compared at the end of training.

    python examples/torchrl/learning_parity.py --seeds 5 --frames 20000
    python examples/torchrl/learning_parity.py --smoke          # 2 seeds, a few hundred frames

Every run is ``dqn_sota.train`` with the same arguments but ``--buffer``; both
buffers sample uniformly with replacement (TorchRL's prioritized sampler needs
its C++ extension). A run seeds torch, the env and the collector with its seed;
the two buffers of one seed start from the same network and the same env. Runs
go one after the other, against one tdreplay server started here (or
``--url``), each on its own table.

Each run's training-episode returns are recorded against the frames collected
when the episode ended. The late return of a run is the mean return of the
episodes that ended in the last ``--late`` fraction of the frames (20%); the
two buffers' late returns are compared with Welch's t-test (two-sided). Writes
``learning_parity.json`` (every run's episodes, the binned curves, the summary)
and ``learning_parity.png`` (mean return per buffer with its 95% confidence
band over seeds; matplotlib where installed, else Pillow).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import dqn_sota  # noqa: E402
from local_server import local_server  # noqa: E402

BUFFERS = ("torchrl", "tdreplay")
COLORS = ((31, 119, 180), (255, 127, 14))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running tdreplay server (default: start one)")
    p.add_argument("--seeds", type=int, default=5, help="seeds per buffer: 0, 1, ...")
    p.add_argument("--frames", type=int, default=20_000, help="frames per run")
    p.add_argument("--init-frames", type=int, default=1_000)
    p.add_argument("--late", type=float, default=0.2, help="last fraction of frames compared")
    p.add_argument("--bins", type=int, default=40, help="points of the mean curves")
    p.add_argument("--json", type=Path, help="default: learning_parity.json here")
    p.add_argument("--png", type=Path, help="default: learning_parity.png here")
    p.add_argument("--replot", action="store_true", help="draw the PNG from the JSON, no runs")
    p.add_argument(
        "--smoke", action="store_true", help="2 seeds x 400 frames; no files unless named"
    )
    return p.parse_args(argv)


# -- statistics (no scipy here: the t distribution from the incomplete beta function) --


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300

    def clamp(v: float) -> float:
        return v if abs(v) > tiny else tiny

    c, d = 1.0, 1.0 / clamp(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, 300):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for num in (even, odd):
            d = 1.0 / clamp(1.0 + num * d)
            c = clamp(1.0 + num / c)
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile (q > 0.5) of Student's t, by bisection on the tail."""
    lo, hi = 0.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) / 2 > 1.0 - q else (lo, mid)
    return (lo + hi) / 2


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its ``level`` confidence interval (t, n - 1 df)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, t_quantile(0.5 + level / 2, n - 1) * math.sqrt(var / n)


def welch(a: list[float], b: list[float]) -> dict[str, float]:
    """Welch's two-sample t-test (unequal variances), two-sided: t, df, p."""
    a = [x for x in a if not math.isnan(x)]
    b = [x for x in b if not math.isnan(x)]
    if len(a) < 2 or len(b) < 2:
        return {"t": math.nan, "df": math.nan, "p": math.nan}
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    if va + vb == 0:
        return {"t": math.nan, "df": math.nan, "p": math.nan}
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return {"t": t, "df": df, "p": t_two_sided_p(t, df)}


# -- curves --------------------------------------------------------------------------


def binned(episodes: list[list[float]], frames: int, bins: int) -> list[float]:
    """Mean return of the episodes that ended in each of ``bins`` equal frame bins; an
    empty bin repeats the previous one (NaN before the first episode)."""
    width = frames / bins
    out: list[float] = []
    for i in range(bins):
        inside = [r for f, r in episodes if i * width < f <= (i + 1) * width]
        out.append(sum(inside) / len(inside) if inside else (out[-1] if out else math.nan))
    return out


def late_return(episodes: list[list[float]], frames: int, late: float) -> float:
    tail = [r for f, r in episodes if f > (1.0 - late) * frames]
    return sum(tail) / len(tail) if tail else math.nan


def strict(value: Any) -> Any:
    """``value`` with every NaN as ``None``, for strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict(v) for v in value]
    return value


def loose(value: Any) -> Any:
    """``strict`` undone: ``None`` back to NaN."""
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: loose(v) for k, v in value.items()}
    if isinstance(value, list):
        return [loose(v) for v in value]
    return value


def plot(result: dict[str, Any], path: Path) -> None:
    """Mean return per buffer with its 95% band; matplotlib where installed, else Pillow."""
    x = result["curves"]["frames"]
    series = {}
    for buffer, color in zip(BUFFERS, COLORS, strict=True):
        s = result["summary"][buffer]
        label = f"{buffer} (n={s['n']}; last {result['config']['late']:.0%}: "
        label += f"{s['late_mean']:.0f} ± {s['late_ci95']:.0f})"
        series[label] = (result["curves"][buffer]["mean"], result["curves"][buffer]["ci95"], color)
    w = result["summary"]["welch"]
    title = f"DQN CartPole-v1, uniform sampling: Welch t = {w['t']:.2f}, p = {w['p']:.2f}"
    xlabel, ylabel = "frames collected", "training episode return (mean, 95% CI over seeds)"
    shade_from = (1 - result["config"]["late"]) * x[-1]
    try:
        import matplotlib
    except ImportError:
        from band_plot import draw_bands

        draw_bands(
            path, x, series, title=title, xlabel=xlabel, ylabel=ylabel, shade_from=shade_from
        )
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.6, 4.8))
    for label, (mean, half, color) in series.items():
        rgb = tuple(c / 255 for c in color)
        ax.plot(x, mean, color=rgb, label=label)
        lo = [m - h for m, h in zip(mean, half, strict=True)]
        hi = [m + h for m, h in zip(mean, half, strict=True)]
        ax.fill_between(x, lo, hi, color=rgb, alpha=0.25)
    ax.axvspan(shade_from, x[-1], color="grey", alpha=0.1)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_all(args: argparse.Namespace, url: str, scratch: Path) -> list[dict[str, Any]]:
    runs = []
    for seed in range(args.seeds):
        for buffer in BUFFERS:
            argv = ["--buffer", buffer, "--sampler", "uniform", "--seed", str(seed)]
            argv += ["--frames", str(args.frames), "--init-frames", str(args.init_frames)]
            argv += ["--save-every", "0", "--table", f"parity_{seed}"]
            argv += ["--out", str(scratch / f"{buffer}-{seed}")]
            summary = dqn_sota.train(dqn_sota.parse(argv), url)
            late = late_return(summary["episodes"], args.frames, args.late)
            print(
                f"{buffer:8s} seed {seed}: {summary['seconds']:.0f} s, "
                f"{len(summary['episodes'])} episodes, late return {late:.1f}",
                flush=True,
            )
            summary["rows"] = summary.pop("buffer")  # the buffer's size at the end
            runs.append({"buffer": buffer, "seed": seed, "late_return": late, **summary})
    return runs


def summarize(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    width = args.frames / args.bins
    curves: dict[str, Any] = {"frames": [round((i + 1) * width) for i in range(args.bins)]}
    summary: dict[str, Any] = {}
    late: dict[str, list[float]] = {}
    for buffer in BUFFERS:
        mine = [r for r in runs if r["buffer"] == buffer]
        per_run = [binned(r["episodes"], args.frames, args.bins) for r in mine]
        stats = [mean_ci([c[i] for c in per_run if not math.isnan(c[i])]) for i in range(args.bins)]
        curves[buffer] = {"mean": [m for m, _ in stats], "ci95": [h for _, h in stats]}
        late[buffer] = [r["late_return"] for r in mine]
        m, h = mean_ci(late[buffer])
        summary[buffer] = {
            "n": len(mine),
            "late_returns": late[buffer],
            "late_mean": m,
            "late_ci95": h,
            "seconds": sum(r["seconds"] for r in mine),
        }
    summary["welch"] = welch(late["tdreplay"], late["torchrl"])  # t > 0: tdreplay higher
    return {"curves": curves, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.smoke:
        args.seeds, args.frames, args.init_frames, args.bins = 2, 400, 200, 4
    if args.replot:
        args.json = args.json or HERE / "learning_parity.json"
        plot(loose(json.loads(args.json.read_text())), args.png or HERE / "learning_parity.png")
        return 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tdreplay-parity-") as tmp:
        scratch = Path(tmp)
        where = scratch if args.smoke else HERE
        args.json = args.json or where / "learning_parity.json"
        args.png = args.png or where / "learning_parity.png"
        with local_server(args.url) as url:
            runs = run_all(args, url, scratch / "runs")
        result = {
            "config": {
                "script": "examples/torchrl/dqn_sota.py --sampler uniform --save-every 0",
                "seeds": args.seeds,
                "frames": args.frames,
                "init_frames": args.init_frames,
                "late": args.late,
                "test": "Welch's t-test, two-sided, on per-run late returns (tdreplay - torchrl)",
            },
            **summarize(args, runs),
            "runs": runs,
        }
        result["wall_seconds"] = time.perf_counter() - start
        args.json.write_text(json.dumps(strict(result), indent=1) + "\n")
        plot(result, args.png)
    s, w = result["summary"], result["summary"]["welch"]
    for buffer in BUFFERS:
        print(
            f"{buffer:8s} late return {s[buffer]['late_mean']:.1f} ± {s[buffer]['late_ci95']:.1f}"
        )
    print(f"Welch t = {w['t']:.3f}, df = {w['df']:.1f}, p = {w['p']:.3f}")
    print(f"wall {result['wall_seconds']:.0f} s; wrote {args.json}, {args.png}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
