"""tdreplay's side of the client-path benchmarks: a worker process and the workloads it times.

Started by ``bench/http_bench.py`` and ``bench/peers_bench.py`` as ``python
bench/tdreplay_cases.py`` and driven over stdin/stdout (``common.serve_worker``):
the setup command carries the server's ``url``, the tables' ``fields``, the
``transports`` to build clients for, and optionally ``raw_url`` and ``torchrl``.

Every tdreplay case goes through the public client, as a user's code does:
``ReplayClient(url, transport=...)``, batches decoded into TensorDicts.
Case names (``{t}``: ``cartpole`` or ``atari``; ``{tr}``: a transport)::

    tdreplay {tr}: {t} sample b{n}        client.sample(t, n), one call per batch
    tdreplay {tr}: {t} loader b{n}        next(iter(client.loader(t, n, prefetch=4)))
    tdreplay {tr}: {t} stream b{n}        the same with loader(..., stream=True)
    tdreplay {tr}: {t} writer             256 x w.append(step) on client.writer(t, chunk=256)
    tdreplay {tr}: {t} extend b256        client.extend(t, rows) of 256 rows

and the in-run baselines, built only when asked for (``"baselines": true``)::

    raw http: {t} sample b{n}             http.client reading the very bytes of a tdreplay
                                          sample of that size from a bare Starlette app,
                                          into a reused buffer, no decode
    raw http + gather: atari sample b256  the same, the bare app first gathering the batch's
                                          large columns (index_select of random rows of
                                          memmap files, as tdreplay's memmap backend) into
                                          the body: the least a sample costs on the machine
    raw http: {t} extend b256             http.client posting the same Arrow body to it
    torchrl: {t} sample b{n}              ReplayBuffer(LazyTensorStorage, RandomSampler),
                                          in process, rb.sample(n)
    torchrl: {t} extend b256 / add        rb.extend(rows) / 256 x rb.add(step)

Not named ``*_bench.py``: ``bench/run.py`` runs every file that is.
"""

from __future__ import annotations

import http.client
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workers import Case, serve_worker

BATCHES = {"cartpole": (1, 32, 256), "atari": (32, 256)}
LOADERS = {"cartpole": (1, 32, 256), "atari": (256,)}
STREAMS = {"cartpole": (1,), "atari": ()}
FILL = {"cartpole": 10_000, "atari": 4096}
CHUNK = 256  # writer(chunk=256) and extends of 256 rows
GATHERED = {("atari", 256)}  # the samples that also get a "raw http + gather" baseline
PREFETCH = 4
ARROW = "application/vnd.apache.arrow.stream"

RAW_APP = r"""
import sys, uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
bodies = {}
async def put(request):
    bodies[request.path_params["name"]] = await request.body()
    return Response(b"{}", media_type="application/json")
async def get(request):
    return Response(bodies[request.path_params["name"]], media_type="ARROW_TYPE")
async def sink(request):
    body = await request.body()
    return Response(b'{"rows": %d}' % len(body), media_type="application/json")
async def ready(request):
    return Response(b"ok")
import numpy as np, torch
torch.set_num_threads(1)
gathers = {}
async def gather_put(request):
    q = request.query_params  # columns of random rows in memmap files, and a body to gather into
    rows, cols = int(q["capacity"]), [int(b) for b in q["row_bytes"].split(",")]
    name, folder = request.path_params["name"], sys.argv[2]
    files = [np.memmap(f"{folder}/{name}-{i}.memmap", dtype=np.uint8, mode="w+", shape=(rows, b))
             for i, b in enumerate(cols)]
    for f in files:
        f[:] = np.random.default_rng(0).integers(0, 256, f.shape, dtype=np.uint8)
    body = np.frombuffer(bytearray(await request.body()), dtype=np.uint8)
    n, at, outs = int(q["n"]), 0, []
    for b in cols:
        outs.append(torch.from_numpy(body[at : at + n * b]).view(n, b))
        at += n * b
    gathers[name] = ([torch.from_numpy(np.asarray(f)) for f in files], outs, body, rows, n)
    return Response(b"{}", media_type="application/json")
async def gather(request):
    cols, outs, body, rows, n = gathers[request.path_params["name"]]
    index = torch.randint(0, rows, (n,))
    for t, out in zip(cols, outs):
        torch.index_select(t, 0, index, out=out)
    return Response(memoryview(body), media_type="ARROW_TYPE")
app = Starlette(routes=[Route("/bytes/{name}", put, methods=["PUT"]),
                        Route("/bytes/{name}", get, methods=["POST"]),
                        Route("/gather/{name}", gather_put, methods=["PUT"]),
                        Route("/gather/{name}", gather, methods=["POST"]),
                        Route("/sink", sink, methods=["POST"]), Route("/readyz", ready)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            loop="uvloop", http="httptools", access_log=False, timeout_keep_alive=3600)
""".replace(
    "ARROW_TYPE", ARROW
)  # the same loop and parser as tdreplay's server: only the replay work differs


def rows(fields: dict[str, tuple[list[int], str]], n: int, seed: int = 0) -> Any:
    """``n`` rows of random data in the table's layout, as a TensorDict (nested on dots)."""
    import torch
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    td = TensorDict(batch_size=[n])
    for name, (shape, dtype) in fields.items():
        dt, size = getattr(torch, dtype), [n, *shape]
        if dt == torch.bool:
            t = torch.rand(size, generator=g) < 0.05
        elif dt.is_floating_point:
            t = torch.randn(size, generator=g).to(dt)
        else:
            t = torch.randint(0, 255, size, generator=g, dtype=dt)
        td.set(tuple(name.split(".")), t)
    return td


class RawHTTP:
    """One keep-alive ``http.client`` connection, bodies read into a reused buffer."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)
        self.view = memoryview(bytearray(64 << 20))

    def call(self, method: str, path: str, body: Any = None, headers: dict | None = None) -> int:
        try:
            self.conn.request(method, path, body=body, headers=headers or {})
            resp = self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self.conn.close()  # the server dropped an idle keep-alive connection: once more
            self.conn.request(method, path, body=body, headers=headers or {})
            resp = self.conn.getresponse()
        n = int(resp.getheader("Content-Length") or 0)
        got = resp.readinto(self.view[:n]) if n else len(resp.read())
        if resp.status != 200:
            raise RuntimeError(f"{method} {path}: {resp.status} {bytes(self.view[:300])!r}")
        return got

    def body(self, method: str, path: str) -> bytes:
        n = self.call(method, path)
        return bytes(self.view[:n])


def make_cases(cfg: dict[str, Any]) -> dict[str, Case]:
    import torch

    from tdreplay.client import ReplayClient

    torch.set_num_threads(1)  # BASELINES.md "Threads": the cores are shared with the server
    fields: dict[str, dict[str, tuple[list[int], str]]] = {
        t: {k: (s, d) for k, (s, d) in f.items()} for t, f in cfg["fields"].items()
    }
    tables = list(fields)
    chunks = {t: rows(fields[t], CHUNK, seed=1) for t in tables}
    steps = {t: [chunks[t][i] for i in range(CHUNK)] for t in tables}
    cases: dict[str, Case] = {}
    clients = {tr: ReplayClient(cfg["url"], transport=tr, timeout=120) for tr in cfg["transports"]}
    fill = next(iter(clients.values()))
    for t in tables:  # fill the tables once, before any case
        for i in range(0, FILL[t], CHUNK):
            fill.extend(t, rows(fields[t], CHUNK, seed=100 + i))

    for tr, client in clients.items():
        if client.transport != tr:
            raise RuntimeError(f"asked for transport {tr!r}, got {client.transport!r}")
        for t in tables:
            for n in BATCHES[t]:
                cases[f"tdreplay {tr}: {t} sample b{n}"] = Case(
                    lambda c=client, t=t, n=n: c.sample(t, n), n
                )
            for n in LOADERS[t]:
                cases[f"tdreplay {tr}: {t} loader b{n}"] = loader_case(client, t, n, False)
            for n in STREAMS[t]:
                cases[f"tdreplay {tr}: {t} stream b{n}"] = loader_case(client, t, n, True)
            cases[f"tdreplay {tr}: {t} writer"] = writer_case(client, t, steps[t])
            cases[f"tdreplay {tr}: {t} extend b{CHUNK}"] = Case(
                lambda c=client, t=t: c.extend(t, chunks[t]), CHUNK
            )
    if cfg.get("raw_url"):
        cases.update(raw_cases(cfg["url"], cfg["raw_url"], fields, chunks))
    if cfg.get("torchrl"):
        cases.update(torchrl_cases(fields, chunks, steps))
    return cases


def loader_case(client: Any, table: str, n: int, stream: bool) -> Case:
    """``next`` on one long-lived loader iterator (its fetchers keep ``prefetch`` batches ready)."""
    it = iter(client.loader(table, n, prefetch=PREFETCH, stream=stream))
    return Case(lambda: next(it), n)


def writer_case(client: Any, table: str, steps: list[Any]) -> Case:
    """256 steps appended one by one, as a collector does: one chunk sent per call."""
    writer = client.writer(table, chunk=CHUNK, max_delay=None)

    def call() -> None:
        for step in steps:
            writer.append(step)

    return Case(call, len(steps), finish=writer.flush)


def raw_cases(url: str, raw_url: str, fields: dict, chunks: dict) -> dict[str, Case]:
    import math

    from tdreplay.codec import encode
    from tdreplay.codec.dtypes import TORCH

    tables = list(fields)
    src, raw = RawHTTP(url), RawHTTP(raw_url)
    cases: dict[str, Case] = {}
    for t in tables:
        for n in BATCHES[t]:
            body = src.body("POST", f"/v1/tables/{t}/sample?batch_size={n}")
            raw.call("PUT", f"/bytes/{t}-{n}", body)
            cases[f"raw http: {t} sample b{n}"] = Case(
                lambda p=f"/bytes/{t}-{n}": raw.call("POST", p), n
            )
            if (t, n) in GATHERED:
                big = [math.prod(s) * TORCH[d].itemsize for s, d in fields[t].values()]
                big = [b for b in big if b >= 1024]  # the columns a gather costs anything for
                query = f"capacity={FILL[t]}&n={n}&row_bytes={','.join(map(str, big))}"
                raw.call("PUT", f"/gather/{t}-{n}?{query}", body)
                cases[f"raw http + gather: {t} sample b{n}"] = Case(
                    lambda p=f"/gather/{t}-{n}": raw.call("POST", p), n
                )
        body = encode(chunks[t]).to_pybytes()
        cases[f"raw http: {t} extend b{CHUNK}"] = Case(
            lambda b=body: raw.call("POST", "/sink", b, {"Content-Type": ARROW}), CHUNK
        )
    return cases


def torchrl_cases(fields: dict, chunks: dict, steps: dict) -> dict[str, Case]:
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers.samplers import RandomSampler

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    cases: dict[str, Case] = {}
    for t in fields:
        rb = ReplayBuffer(storage=LazyTensorStorage(FILL[t]), sampler=RandomSampler())
        for i in range(0, FILL[t], CHUNK):
            rb.extend(rows(fields[t], CHUNK, seed=100 + i))
        for n in BATCHES[t]:
            cases[f"torchrl: {t} sample b{n}"] = Case(lambda rb=rb, n=n: rb.sample(n), n)
        cases[f"torchrl: {t} extend b{CHUNK}"] = Case(
            lambda rb=rb, t=t: rb.extend(chunks[t]), CHUNK
        )

        def add(rb: Any = rb, t: str = t) -> None:
            for step in steps[t]:
                rb.add(step)

        cases[f"torchrl: {t} add"] = Case(add, CHUNK)
    return cases


if __name__ == "__main__":
    serve_worker(make_cases, {"side": "tdreplay"})
