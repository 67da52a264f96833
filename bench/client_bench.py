"""Client benchmark: end-to-end sample throughput against the raw-bytes ceiling, and learner wait.

    python bench/client_bench.py            # full run (< 3 min)
    python bench/client_bench.py --quick    # a smoke run (~30 s)
    python bench/client_bench.py --json bench/results/client.json   # what the README renders

Starts, in the same run and on this machine:

* a tdreplay server (``python -m tdreplay.service serve``) holding the shipped
  atari (u8[84,84,4] frames, ~56 KB per item) and cartpole schemas on the
  default memmap backend (``common.schemas``);
* a bare Starlette app (uvicorn, same loop and parser) that answers ``POST /raw``
  with the very bytes of a sampled atari batch and ``GET /tiny`` with ``{}``:
  the ceiling a Python HTTP server and client can reach with no replay work.

Then reports medians over repetitions:

1. HTTP client choice: ``http.client`` reading into a reused buffer vs httpx
   (sync), and the asyncio-streams transport vs ``httpx.AsyncClient``, on the
   raw route (large body) and the tiny route (calls per second);
2. ``ReplayClient.sample`` (atari b256, cartpole b256/b32), the async twin and
   the loader, as items/s and GB/s, and their ratio to the raw ceiling;
3. how long a learner waits per batch with and without prefetch, the
   learner's step simulated as a device wait (``time.sleep``, the GIL free)
   of 1.5 times the measured latency of one sample.

Figures vary ±25% from run to run when other work shares the cores; compare
ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import entry, free_port, machine, print_entries, schemas, write_json
from items import ATARI, CARTPOLE  # bench/ is on sys.path when run as a script
from tensordict import TensorDict

from tdreplay.client import AsyncReplayClient, ReplayClient
from tdreplay.client.aio_transport import AsyncTransport
from tdreplay.client.commands import Request
from tdreplay.client.transport import Transport

RAW_APP = r"""
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
body = open(sys.argv[1], "rb").read()
async def raw(request):
    return Response(body, media_type="application/vnd.apache.arrow.stream")
async def tiny(request):
    return Response(b"{}", media_type="application/json")
app = Starlette(routes=[Route("/raw", raw, methods=["POST"]), Route("/tiny", tiny)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning",
            loop="uvloop", http="httptools", access_log=False)
"""


def wait_up(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up")


def rows(fields: dict[str, Any], n: int) -> TensorDict:
    td = TensorDict(batch_size=[n])
    for name, f in fields.items():
        shape, dtype = [n, *f["shape"]], getattr(torch, f["dtype"])
        if dtype == torch.bool:
            t = torch.rand(shape) < 0.01
        elif dtype.is_floating_point:
            t = torch.randn(shape).to(dtype)
        else:
            t = torch.randint(0, 255, shape, dtype=dtype)
        td.set(tuple(name.split(".")), t)
    return td


def timed(fn: Callable[[], Any], seconds: float, reps: int) -> tuple[float, int]:
    """Median calls/s over ``reps`` runs of about ``seconds`` each (after one warm-up call)."""
    fn()
    rates = []
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
        rates.append(n / dt)
    return statistics.median(rates), reps


def timed_async(make: Callable[[], Any], seconds: float, reps: int) -> float:
    async def run() -> float:
        call = make()
        await call()
        rates = []
        for _ in range(reps):
            n, t0 = 0, time.perf_counter()
            while True:
                await call()
                n += 1
                dt = time.perf_counter() - t0
                if dt >= seconds:
                    break
            rates.append(n / dt)
        return statistics.median(rates)

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    quick = args.quick
    secs, reps = (0.6, 1) if quick else (2.0, 3)
    atari_items = 1024 if quick else 4096

    procs: list[subprocess.Popen[bytes]] = []
    tmp = tempfile.TemporaryDirectory(prefix="tdreplay-bench-")
    try:
        port, raw_port = free_port(), free_port()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        schemas(Path(tmp.name) / "schemas")
        server = subprocess.Popen(
            [
                *(sys.executable, "-m", "tdreplay.service", "serve", "--root", f"{tmp.name}/data"),
                *("--schema", f"{tmp.name}/schemas", "--host", "127.0.0.1", "--port", str(port)),
                *("--log-level", "warning"),
            ],
            env=env,
        )
        procs.append(server)
        url = f"http://127.0.0.1:{port}"
        wait_up(f"{url}/healthz", server, "tdreplay server")
        client = ReplayClient(url, timeout=60, transport="http")
        for _ in range(atari_items // 256):
            client.extend("atari", rows(ATARI, 256))
        client.extend("cartpole", rows(CARTPOLE, 50_000))

        body_path = Path(tmp.name) / "body.arrow"
        sample_t = Transport(url)
        body = sample_t.execute(
            Request("POST", "/v1/tables/atari/sample?batch_size=256&timeout=10")
        ).body
        body_path.write_bytes(body)
        nbytes = len(body)
        raw = subprocess.Popen([sys.executable, "-c", RAW_APP, str(body_path), str(raw_port)])
        procs.append(raw)
        raw_url = f"http://127.0.0.1:{raw_port}"
        wait_up(f"{raw_url}/tiny", raw, "raw Starlette app")

        print(f"# tdreplay client benchmark ({'quick' if quick else 'full'}; medians of {reps})")
        print(f"atari batch 256 = {nbytes / 1e6:.2f} MB on the wire\n")
        results: dict[str, float] = {}

        # -- 1. HTTP client choice, on the raw app --------------------------------
        reused = memoryview(bytearray(nbytes + 4096))
        raw_t = Transport(raw_url)
        req_big = Request("POST", "/raw", alloc=lambda n: reused[:n])
        results["raw http.client GB/s"] = (
            timed(lambda: raw_t.execute(req_big), secs, reps)[0] * nbytes / 1e9
        )
        results["raw http.client tiny/s"] = timed(
            lambda: raw_t.execute(Request("GET", "/tiny")), secs, reps
        )[0]

        def async_raw(path: str, method: str) -> Callable[[], Any]:
            t = AsyncTransport(raw_url)
            return lambda: t.execute(Request(method, path))

        results["raw asyncio GB/s"] = (
            timed_async(lambda: async_raw("/raw", "POST"), secs, reps) * nbytes / 1e9
        )
        results["raw asyncio tiny/s"] = timed_async(lambda: async_raw("/tiny", "GET"), secs, reps)
        try:
            import httpx

            hx = httpx.Client(base_url=raw_url)
            results["raw httpx GB/s"] = (
                timed(lambda: hx.post("/raw").content, secs, reps)[0] * nbytes / 1e9
            )
            results["raw httpx tiny/s"] = timed(lambda: hx.get("/tiny").content, secs, reps)[0]

            def hx_async(path: str, method: str) -> Callable[[], Any]:
                ac = httpx.AsyncClient(base_url=raw_url)

                async def call() -> bytes:
                    return (await ac.request(method, path)).content

                return call

            results["raw httpx.AsyncClient GB/s"] = (
                timed_async(lambda: hx_async("/raw", "POST"), secs, reps) * nbytes / 1e9
            )
            results["raw httpx.AsyncClient tiny/s"] = timed_async(
                lambda: hx_async("/tiny", "GET"), secs, reps
            )
        except ImportError:
            print("(httpx not installed: its rows are skipped)")

        # -- 2. end to end ---------------------------------------------------------
        atari_rate = timed(lambda: client.sample("atari", 256), secs, reps)[0]
        results["sample atari b256 items/s"] = atari_rate * 256
        results["sample atari b256 GB/s"] = atari_rate * nbytes / 1e9

        def async_sample() -> Callable[[], Any]:
            ac = AsyncReplayClient(url, timeout=60)
            return lambda: ac.sample("atari", 256)

        results["async sample atari b256 GB/s"] = (
            timed_async(async_sample, secs, reps) * nbytes / 1e9
        )
        for b in (256, 32):
            results[f"sample cartpole b{b} items/s"] = (
                timed(lambda b=b: client.sample("cartpole", b), secs, reps)[0] * b
            )

        def loader_rate(prefetch: int) -> float:
            it = iter(client.loader("atari", 256, prefetch=prefetch))
            next(it)
            rates = []
            for _ in range(reps):
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < secs:
                    next(it)
                    n += 1
                rates.append(n / (time.perf_counter() - t0))
            it.close()
            return statistics.median(rates)

        results["loader atari b256 (prefetch 4) GB/s"] = loader_rate(4) * nbytes / 1e9

        # -- 3. learner wait ---------------------------------------------------------
        latency = 1.0 / atari_rate
        step = max(0.002, 1.5 * latency)
        n_batches = 15 if quick else 40
        waits_none, waits_pf = [], []
        for _ in range(reps):
            w = 0.0
            for _ in range(n_batches):
                t0 = time.perf_counter()
                client.sample("atari", 256)
                w += time.perf_counter() - t0
                time.sleep(step)  # the learner's step: the GPU busy, the GIL free
            waits_none.append(w / n_batches)
            loader = client.loader("atari", 256, prefetch=4, num_batches=n_batches + 4)
            it = iter(loader)
            for _ in range(4):  # warm-up: the first batches are waited for by anyone
                next(it)
                time.sleep(step)
            w0 = it.wait_s
            for _ in it:
                time.sleep(step)
            waits_pf.append((it.wait_s - w0) / n_batches)
        results["learner wait/batch, no prefetch ms"] = statistics.median(waits_none) * 1e3
        results["learner wait/batch, prefetch 4 ms"] = statistics.median(waits_pf) * 1e3

        width = max(len(k) for k in results)
        for k, v in results.items():
            print(f"{k:<{width}}  {v:>12,.2f}")
        ceiling = results["raw http.client GB/s"]
        print("\nratios (same run):")
        print(f"  sample / raw ceiling           {results['sample atari b256 GB/s'] / ceiling:.2f}")
        print(
            f"  loader / raw ceiling           "
            f"{results['loader atari b256 (prefetch 4) GB/s'] / ceiling:.2f}"
        )
        print(
            f"  async sample / raw ceiling     {results['async sample atari b256 GB/s'] / ceiling:.2f}"
        )
        if "raw httpx GB/s" in results:
            print(f"  http.client / httpx (large)    {ceiling / results['raw httpx GB/s']:.2f}")
            print(
                f"  http.client / httpx (tiny)     "
                f"{results['raw http.client tiny/s'] / results['raw httpx tiny/s']:.2f}"
            )
            print(
                f"  asyncio / httpx.Async (large)  "
                f"{results['raw asyncio GB/s'] / results['raw httpx.AsyncClient GB/s']:.2f}"
            )
            print(
                f"  asyncio / httpx.Async (tiny)   "
                f"{results['raw asyncio tiny/s'] / results['raw httpx.AsyncClient tiny/s']:.2f}"
            )
        print(f"  learner step simulated         {step * 1e3:.1f} ms")
        print_entries(entries(results))
        if args.json:
            write_json(args.json, "client", entries(results), machine=machine(), quick=quick,
                       reps=reps, seconds=secs, results=results)  # fmt: skip
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        tmp.cleanup()


def entries(results: dict[str, float]) -> list[dict]:
    """The common entries (``bench/common.py``) of the ratios printed above."""
    r = results
    out = [
        entry("client", "sample atari b256", r["sample atari b256 GB/s"], "GB/s",
              "raw http.client, same bytes", r["raw http.client GB/s"]),
        entry("client", "loader atari b256 (prefetch 4)", r["loader atari b256 (prefetch 4) GB/s"],
              "GB/s", "raw http.client, same bytes", r["raw http.client GB/s"]),
        entry("client", "async sample atari b256", r["async sample atari b256 GB/s"], "GB/s",
              "raw http.client, same bytes", r["raw http.client GB/s"]),
        entry("client", "learner wait per batch, prefetch 4", r["learner wait/batch, prefetch 4 ms"],
              "ms", "no prefetch", r["learner wait/batch, no prefetch ms"]),
    ]  # fmt: skip
    if "raw httpx GB/s" in r:
        for what, a, b, unit in (
            ("http.client, 14 MB body", "raw http.client GB/s", "raw httpx GB/s", "GB/s"),
            ("http.client, tiny call", "raw http.client tiny/s", "raw httpx tiny/s", "calls/s"),
            ("asyncio streams, 14 MB body", "raw asyncio GB/s", "raw httpx.AsyncClient GB/s",
             "GB/s"),
            ("asyncio streams, tiny call", "raw asyncio tiny/s", "raw httpx.AsyncClient tiny/s",
             "calls/s"),
        ):  # fmt: skip
            base = "httpx.AsyncClient" if "asyncio" in what else "httpx"
            out.append(entry("client", what, r[a], unit, base, r[b]))
    return out


if __name__ == "__main__":
    main()
