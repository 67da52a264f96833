"""HTTP throughput of tdreplay next to the Python HTTP ceiling and the in-process table, in one run.

For cartpole and atari items (the shapes of BASELINES.md), sample and extend
at batch 1, 32 and 256:

* **tdreplay**: a ``tdreplay serve`` process (memory backend, uniform
  sampler, no rate limiter), ``POST /v1/tables/{name}/sample`` and
  ``/extend`` with Arrow IPC bodies;
* **ceiling**: a bare Starlette route in a uvicorn process configured the
  same way (uvloop, httptools, pinned malloc thresholds) that returns, or
  reads, the same number of raw bytes: the most a Python HTTP server does;
* **in-process**: ``Table.sample`` / ``Table.extend`` on the same table spec,
  no HTTP.

The client is ``http.client`` on one persistent connection, reading bodies
into a reused buffer (the same for both servers). Every figure is the
median of ``--reps`` repetitions; ratios are tdreplay over ceiling (MB/s)
and over in-process (items/s). Also reported: cartpole batch-32 sample
latency (p50) and batch-1 streaming throughput.

    python bench/http_bench.py            # full run, about 2-3 minutes
    python bench/http_bench.py --quick    # a smoke run, well under a minute

Not a test: figures depend on the machine; compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from items import ATARI, CARTPOLE  # bench/ is on sys.path when run as a script
from tensordict import TensorDict

from tdreplay.codec import encode
from tdreplay.service.tuning import pin_malloc
from tdreplay.storage import Table, TableSpec

REPO = Path(__file__).resolve().parents[1]
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456"}
BATCHES = (1, 32, 256)
ARROW = "application/vnd.apache.arrow.stream"

SPECS: dict[str, dict[str, Any]] = {
    "cartpole": {"capacity": 100_000, "fields": CARTPOLE},
    "atari": {"capacity": 4096, "fields": ATARI},
}


def spec(name: str) -> dict[str, Any]:
    return {"name": name, "backend": {"kind": "memory"}, **SPECS[name]}


def rows(name: str, n: int, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, f in SPECS[name]["fields"].items():
        shape = [n, *f["shape"]]
        if f["dtype"] == "bool":
            out[key] = torch.rand(shape, generator=g) < 0.1
        elif f["dtype"] == "uint8":
            out[key] = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        elif f["dtype"] == "int64":
            out[key] = torch.randint(0, 6, shape, generator=g)
        else:
            out[key] = torch.randn(shape, generator=g)
    return TensorDict(out, batch_size=[n]).unflatten_keys(".")


# ------------------------------------------------------------------ the ceiling server
def ceiling_app() -> Any:
    """Bare Starlette: GET /bytes?n= returns n raw bytes, POST /sink reads the body."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    payload = memoryview(os.urandom(1 << 20) * 16)  # 16 MiB

    async def give(request: Request) -> Response:
        n = int(request.query_params["n"])
        return Response(payload[:n], media_type="application/octet-stream")

    async def sink(request: Request) -> Response:
        body = await request.body()
        return Response(b'{"rows": %d}' % len(body), media_type="application/json")

    async def ping(request: Request) -> Response:
        return Response(b"ok")

    return Starlette(
        routes=[
            Route("/bytes", give, methods=["POST"]),
            Route("/sink", sink, methods=["POST"]),
            Route("/readyz", ping),
        ]
    )


def serve_ceiling(port: int) -> None:
    import uvicorn

    uvicorn.run(ceiling_app(), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ------------------------------------------------------------------ processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int) -> subprocess.Popen:
    env = {**os.environ, **MALLOC_ENV}
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {' '.join(cmd)}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return proc
        except OSError:
            pass
        time.sleep(0.1)  # readiness poll
    proc.kill()
    raise SystemExit(f"server not ready: {' '.join(cmd)}")


class Client:
    """One keep-alive connection; bodies read into a reused buffer."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.buf = bytearray(32 << 20)
        self.view = memoryview(self.buf)

    def call(self, method: str, path: str, body: Any = None, headers: dict | None = None) -> int:
        self.conn.request(method, path, body=body, headers=headers or {})
        resp = self.conn.getresponse()
        n = int(resp.getheader("Content-Length") or 0)
        got = resp.readinto(self.view[:n]) if n else len(resp.read())
        if resp.status != 200:
            raise RuntimeError(
                f"{method} {path}: {resp.status} {bytes(self.view[: min(n, 300)])!r}"
            )
        return got


# ------------------------------------------------------------------ measuring
def measure(fn: Callable[[], Any], seconds: float) -> tuple[float, list[float]]:
    """Calls per second of ``fn`` over about ``seconds``, and each call's latency."""
    fn()  # warm
    lat = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        lat.append(t1 - t0)
        if t1 - start >= seconds and len(lat) >= 3:
            return len(lat) / (t1 - start), lat


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per figure (median)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per measurement")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--only",
        default="",
        help="run the workloads whose name contains this (e.g. 'atari sample')",
    )
    parser.add_argument(
        "--server-threads", type=int, default=1, help="the server's --torch-threads (default 1)"
    )
    parser.add_argument("--serve-ceiling", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_ceiling is not None:
        serve_ceiling(args.serve_ceiling)
        return
    seconds = args.seconds or (0.25 if args.quick else 0.7)
    reps = max(3, args.reps)
    pin_malloc(32 << 20, 256 << 20)
    torch.set_num_threads(1)

    tmp = Path(tempfile.mkdtemp(prefix="tdreplay-bench-"))
    schemas = tmp / "schemas"
    schemas.mkdir()
    for name in SPECS:
        (schemas / f"{name}.yaml").write_text(yaml.safe_dump(spec(name)))
    port, cport = free_port(), free_port()
    servers = [
        start(
            [
                sys.executable,
                "-m",
                "tdreplay.service",
                "serve",
                "--schema",
                str(schemas),
                "--root",
                str(tmp / "data"),
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            port,
        ),
        start([sys.executable, __file__, "--serve-ceiling", str(cport)], cport),
    ]
    try:
        results = run(port, cport, seconds, reps, tmp, args.only)
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(30)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def run(
    port: int, cport: int, seconds: float, reps: int, tmp: Path, only: str = ""
) -> dict[str, Any]:
    tdr, ceil = Client(port), Client(cport)
    local = {
        name: Table.create(TableSpec.model_validate(spec(name)), tmp / "local", seed=0)
        for name in SPECS
    }
    fill = {"cartpole": 20_000, "atari": 2048}
    for name, n in fill.items():  # both tables hold the same rows before sampling
        for start_row in range(0, n, 256):
            chunk = rows(name, 256, seed=start_row)
            local[name].extend(chunk)
            tdr.call(
                "POST",
                f"/v1/tables/{name}/extend",
                encode(chunk).to_pybytes(),
                {"Content-Type": ARROW},
            )
    print(f"tdreplay http bench: {reps} reps x {seconds}s per figure, medians; torch threads 1\n")
    head = (
        f"{'workload':<22}{'tdreplay it/s':>14}{'MB/s':>9}{'ceiling MB/s':>14}{'vs ceiling':>12}"
        f"{'in-proc it/s':>14}{'vs in-proc':>12}{'p50 ms':>9}"
    )
    print(head)
    print("-" * len(head))
    results: dict[str, Any] = {}
    for name in SPECS:
        for op in ("sample", "extend"):
            for n in BATCHES:
                if only not in f"{name} {op} b{n}":
                    continue
                body = encode(rows(name, n, seed=n)).to_pybytes() if op == "extend" else None
                td = rows(name, n, seed=n)
                if op == "sample":
                    nbytes = tdr.call("POST", f"/v1/tables/{name}/sample?batch_size={n}")

                    def t_call(name=name, n=n) -> None:
                        tdr.call("POST", f"/v1/tables/{name}/sample?batch_size={n}")

                    def c_call(nbytes=nbytes) -> None:
                        ceil.call("POST", f"/bytes?n={nbytes}")

                    def l_call(name=name, n=n) -> None:
                        local[name].sample(n)
                else:
                    nbytes = len(body)
                    hdr = {"Content-Type": ARROW}

                    def t_call(name=name, body=body, hdr=hdr) -> None:
                        tdr.call("POST", f"/v1/tables/{name}/extend", body, hdr)

                    def c_call(body=body) -> None:
                        ceil.call(
                            "POST", "/sink", body, {"Content-Type": "application/octet-stream"}
                        )

                    def l_call(name=name, td=td) -> None:
                        local[name].extend(td)

                t_rates, c_rates, l_rates, lats = [], [], [], []
                for _ in range(reps):  # interleaved, so drift hits all three alike
                    rate, lat = measure(t_call, seconds)
                    t_rates.append(rate)
                    lats.append(median(lat))
                    c_rates.append(measure(c_call, seconds)[0])
                    l_rates.append(measure(l_call, seconds / 2)[0])
                t_items, c_calls, l_items = (
                    median(t_rates) * n,
                    median(c_rates),
                    median(l_rates) * n,
                )
                t_mbs = median(t_rates) * nbytes / 1e6
                c_mbs = c_calls * nbytes / 1e6
                key = f"{name} {op} b{n}"
                results[key] = {
                    "tdreplay_items_s": t_items,
                    "tdreplay_mb_s": t_mbs,
                    "ceiling_mb_s": c_mbs,
                    "vs_ceiling": t_mbs / c_mbs,
                    "inprocess_items_s": l_items,
                    "vs_inprocess": t_items / l_items,
                    "p50_ms": median(lats) * 1e3,
                    "body_bytes": nbytes,
                }
                print(
                    f"{key:<22}{t_items:>14,.0f}{t_mbs:>9,.0f}{c_mbs:>14,.0f}{t_mbs / c_mbs:>12.2f}"
                    f"{l_items:>14,.0f}{t_items / l_items:>12.2f}{median(lats) * 1e3:>9.2f}"
                )
    if only in "cartpole stream b1":
        rates = [
            stream(port, "cartpole", 1, 20_000 if seconds > 0.5 else 5_000) for _ in range(reps)
        ]
        results["cartpole stream b1"] = {"tdreplay_items_s": median(rates)}
        print(f"\ncartpole stream b1: {median(rates):,.0f} items/s (one chunked Arrow stream)")
    goals = [
        ("atari sample b256", "vs_ceiling", ">= 70% of the ceiling (MB/s)", lambda v: v >= 0.70),
        ("cartpole sample b32", "p50_ms", "p50 <= 2 ms", lambda v: v <= 2.0),
        ("cartpole stream b1", "tdreplay_items_s", ">= 10k items/s", lambda v: v >= 10_000),
    ]
    print("\ngoals:")
    for key, metric, text, ok in goals:
        if key in results:
            value = results[key][metric]
            print(f"  [{'met' if ok(value) else 'MISSED'}] {key} {text}: {value:,.2f}")
    return results


def stream(port: int, name: str, batch: int, count: int) -> float:
    import pyarrow as pa

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    start = time.perf_counter()
    conn.request("GET", f"/v1/tables/{name}/stream?batch_size={batch}&count={count}")
    resp = conn.getresponse()
    got = sum(rb.num_rows for rb in pa.ipc.open_stream(resp))
    elapsed = time.perf_counter() - start
    conn.close()
    assert got == batch * count, got
    return got / elapsed


if __name__ == "__main__":
    main()
