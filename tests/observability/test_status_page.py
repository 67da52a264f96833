"""The /status page in a real headless Chromium against a live server with traffic.

The page loads with no token (its shell holds no data), asks for the token,
then polls GET /v1/status: every plot of every table draws data (tables
named like JavaScript's object internals too), nothing goes to the console
as an error, no request leaves the host - neither the page's nor the
browser's own (:mod:`browserkit`) - and the token is in no URL. The
screenshot lands in ``tmp_path``, and in ``docs/status.png`` (the README's)
with ``TDREPLAY_UPDATE_SCREENSHOT=1``.

Chromium comes from the OS (``make chromium``: ``apt-get install chromium``),
driven by Playwright without its own browser download.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import torch
from browserkit import CHROMIUM, host_only_browser
from obs_helpers import spec
from testkit import REPO, rows

from tdreplay.client import RateLimitTimeout, ReplayClient

playwright = pytest.importorskip(
    "playwright.sync_api", reason="pip install playwright (the test extra)"
)
if CHROMIUM is None and os.environ.get("CI"):  # CI installs it (make test needs make chromium)
    pytest.fail("no chromium on the CI machine: make chromium should have installed it")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on this machine (make chromium installs it)"
)
TOKEN = "status-page-t0ken"
ODD_NAMES = ("__proto__", "constructor")
PLOTS = {"fill", "rates", "spi", "blocked", "latency", "times", "priority"}

#: per plot: points, whether a series holds a finite value, colored pixels on its canvas
PLOT_STATE = """() => {
  const out = [];
  for (const [table, plots] of window.tdreplayStatus.plots) {
    const mine = {};
    out.push([table, mine]);
    for (const [name, u] of Object.entries(plots)) {
      const values = u.data.slice(1).flat().filter((v) => v !== null && Number.isFinite(v));
      const c = u.ctx.canvas, px = u.ctx.getImageData(0, 0, c.width, c.height).data;
      let colored = 0;
      for (let i = 0; i < px.length; i += 4) {
        const hi = Math.max(px[i], px[i + 1], px[i + 2]), lo = Math.min(px[i], px[i + 1], px[i + 2]);
        if (px[i + 3] > 0 && hi - lo > 60) colored++;
      }
      mine[name] = { points: u.data[0].length, finite: values.length, colored };
    }
  }
  return out;
}"""


def traffic(url: str, stop: threading.Event) -> list[threading.Thread]:
    """A collector and a learner on a prioritized table whose limiter makes them wait."""
    admin = ReplayClient(url, token=TOKEN, transport="http")
    limiter = {"samples_per_insert": 4.0, "error_buffer": 128.0, "min_size_to_sample": 32}
    admin.create_table(
        {**spec("replay", {"kind": "prioritized"}), "capacity": 8192, "rate_limiter": limiter}
    )

    def collect() -> None:
        client, i = ReplayClient(url, token=TOKEN, transport="http"), 0
        while not stop.is_set():
            try:
                client.extend("replay", rows(i, 16), timeout=0.5)
                i += 16
            except RateLimitTimeout:
                pass
            time.sleep(0.02)

    def learn() -> None:
        client = ReplayClient(url, token=TOKEN, transport="http")
        while not stop.is_set():
            try:
                batch = client.sample("replay", 32, timeout=0.5)
            except RateLimitTimeout:
                continue
            client.update_priority("replay", batch["index"], torch.rand(32) * 4)

    threads = [threading.Thread(target=f, daemon=True) for f in (collect, learn)]
    for t in threads:
        t.start()
    return threads


def test_status_page_draws_every_plot(live_server: Any, tmp_path: Path) -> None:
    server = live_server(token=TOKEN)
    status, _, shell = server.request("GET", "/status", headers={"Authorization": ""})
    assert status == 200 and b"replay" not in shell.replace(b"tdreplay", b"")
    assert server.request("GET", "/v1/status", headers={"Authorization": ""})[0] == 401
    stop = threading.Event()
    threads = traffic(server.url, stop)
    admin = ReplayClient(server.url, token=TOKEN, transport="http")
    for name in ODD_NAMES:  # keys of every JavaScript object: they must not blank the page
        admin.create_table({**spec(name, {"kind": "uniform"}), "capacity": 64})
        admin.extend(name, rows(0, 8))
    time.sleep(0.5)
    ReplayClient(server.url, token=TOKEN).checkpoint("replay", "checkpoints/replay")
    host = urlsplit(server.url).netloc
    requests: list[str] = []
    left: list[str] = []
    errors: list[str] = []
    try:
        with playwright.sync_playwright() as p, host_only_browser(p) as (browser, proxy):
            page = browser.new_page(viewport={"width": 1400, "height": 1000})

            def route(r: Any) -> None:
                requests.append(r.request.url)
                if urlsplit(r.request.url).netloc != host:
                    left.append(r.request.url)
                    r.abort()
                else:
                    r.continue_()

            page.route("**/*", route)
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{server.url}/status")
            page.wait_for_selector("#login:not([hidden])")
            page.fill("#token", TOKEN)
            page.click("#login button")
            # polled from here: a predicate string would be eval'd, which the page's CSP forbids
            deadline = time.monotonic() + 30
            while page.evaluate("() => window.tdreplayStatus.polls") < 6:
                assert time.monotonic() < deadline, "the page did not poll six times in 30 s"
                time.sleep(0.25)
            plots = dict(page.evaluate(PLOT_STATE))
            page.screenshot(path=str(tmp_path / "status.png"), full_page=True)
            summary = page.inner_text("section.table .summary")
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    assert not errors, errors
    assert not left, left
    assert not proxy.attempts, f"the browser reached for other hosts: {proxy.attempts}"
    assert requests and all(TOKEN not in url for url in requests)
    assert set(plots) == {"replay", *ODD_NAMES} and set(plots["replay"]) == PLOTS
    for name in ODD_NAMES:
        assert plots[name]["fill"]["finite"] > 0, (name, plots[name])
    for name, plot in plots["replay"].items():
        assert plot["finite"] > 0 and plot["colored"] > 20, (name, plot)
        if name not in ("times", "priority"):
            assert plot["points"] >= 3, (name, plot)
    assert "size" in summary and "samples/insert" in summary
    if os.environ.get("TDREPLAY_UPDATE_SCREENSHOT"):
        shutil.copy(tmp_path / "status.png", REPO / "docs" / "status.png")
