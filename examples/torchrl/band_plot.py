"""Mean curves with confidence bands drawn with Pillow, for where matplotlib is not installed.

>>> draw_bands("out.png", [1, 2, 3], {"a": ([1, 2, 3], [0.5, 0.5, 0.5], (31, 119, 180))},
...            title="t", xlabel="x", ylabel="y")  # doctest: +SKIP
"""

from __future__ import annotations

import math
from pathlib import Path

from PIL import Image, ImageDraw

Color = tuple[int, int, int]
W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 480, 70, 20, 40, 50


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step *= next((m for m in (1, 2, 5, 10) if m * step >= raw), 10)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def draw_bands(
    path: str | Path,
    x: list[float],
    series: dict[str, tuple[list[float], list[float], Color]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    shade_from: float | None = None,
) -> None:
    """Write a PNG of each series' mean line over a band of mean ± half-width.

    Args:
        path: the PNG to write.
        x: the x of every point, shared by the series.
        series: label -> (means, half-widths, RGB colour); NaN points are skipped.
        title, xlabel, ylabel: the captions.
        shade_from: shade the plot from this x to the end (grey).
    """
    ys = [
        v
        for mean, half, _ in series.values()
        for m, h in zip(mean, half, strict=True)
        for v in (m - (h if math.isfinite(h) else 0), m + (h if math.isfinite(h) else 0))
        if math.isfinite(v)
    ]
    y0, y1 = min([0.0, *ys]), max([1.0, *ys])
    x0, x1 = 0.0, max(x)

    def px(xv: float, yv: float) -> tuple[float, float]:
        return (
            LEFT + (xv - x0) / (x1 - x0) * (W - LEFT - RIGHT),
            H - BOTTOM - (yv - y0) / (y1 - y0) * (H - TOP - BOTTOM),
        )

    img = Image.new("RGB", (W, H), "white")

    def blend(polygon: list[tuple[float, float]], fill: tuple[int, int, int, int]) -> None:
        # one layer per shape, so overlapping bands mix instead of covering each other
        layer = Image.new("RGBA", (W, H), (0, 0, 0, 0))
        ImageDraw.Draw(layer).polygon(polygon, fill=fill)
        img.paste(layer, (0, 0), layer)

    if shade_from is not None:
        (ax, ay), (bx, by) = px(shade_from, y1), px(x1, y0)
        blend([(ax, ay), (bx, ay), (bx, by), (ax, by)], (128, 128, 128, 30))
    for mean, half, color in series.values():
        pts = [(xv, m, h) for xv, m, h in zip(x, mean, half, strict=True) if math.isfinite(m)]
        hw = [(xv, m, h if math.isfinite(h) else 0.0) for xv, m, h in pts]
        band = [px(xv, m + h) for xv, m, h in hw] + [px(xv, m - h) for xv, m, h in reversed(hw)]
        if len(band) >= 3:
            blend(band, (*color, 60))
    draw = ImageDraw.Draw(img)
    for mean, _, color in series.values():
        line = [px(xv, m) for xv, m in zip(x, mean, strict=True) if math.isfinite(m)]
        if len(line) >= 2:
            draw.line(line, fill=color, width=2)
    draw.rectangle([px(x0, y1), px(x1, y0)], outline="black")
    for t in _ticks(y0, y1):
        cx, cy = px(x0, t)
        draw.line([(cx - 4, cy), (cx, cy)], fill="black")
        draw.text((cx - 8, cy), f"{t:g}", fill="black", anchor="rm")
    for t in _ticks(x0, x1):
        cx, cy = px(t, y0)
        draw.line([(cx, cy), (cx, cy + 4)], fill="black")
        draw.text((cx, cy + 6), f"{t:g}", fill="black", anchor="ma")
    draw.text((W / 2, 12), title, fill="black", anchor="ma")
    draw.text((W / 2, H - 18), xlabel, fill="black", anchor="ma")
    draw.text((6, TOP - 22), ylabel, fill="black")
    for i, (label, (_, _, color)) in enumerate(series.items()):
        lx, ly = LEFT + 12, TOP + 10 + 16 * i
        draw.line([(lx, ly + 6), (lx + 20, ly + 6)], fill=color, width=3)
        draw.text((lx + 26, ly), label, fill="black")
    img.save(path)
