"""The collector's writer: ``client.writer(table, chunk=256)`` fed step by step, next to batched extends.

    python bench/writer_bench.py                 # full run (~1.5 min): 5 rounds of 1.5 s per case
    python bench/writer_bench.py --quick         # ~20 s: 2 rounds of 0.5 s
    python bench/writer_bench.py --json bench/results/writer.json
    python bench/writer_bench.py --transports http

A collector produces one step at a time; ``client.writer(table, chunk=256)``
buffers the steps and sends one ``extend`` of 256 rows per chunk. This
measures that path through the public client, as a collector runs it: 256
single-step TensorDicts (batch ``[]``, each its own tensors, the way an
environment step comes out) appended one by one per timed call, the writer
made with its defaults (``max_delay`` 1 s, so its timer thread runs), its
last chunk flushed inside the timed window. The baseline, in the same run,
interleaved, is ``client.extend(table, rows)`` of the same 256 rows already
batched: what the writer could at best reach, since it sends exactly that.
The ratio (writer / extend) is the cost of collecting the steps into a chunk
on the client (stacking 256 TensorDicts) on top of the send; the writer
against Reverb's writers is in ``peers_bench.py``.

Where the writer is bound, in the same run: ``{t} buffer only`` appends the
same steps into the writer's buffer (``ChunkBuffer``, what ``append`` does
per step: read the leaves, check them against the first step's, copy them
into the chunk's rows) and takes the chunk, sending nothing. Its rate over
the extend's is the most the writer / extend ratio can reach with sends
that cost the client nothing. ``{t} waiting`` is the same writer made with
``background=False``: each chunk's answer waited for in the append that
sent it; the default's gain over it is what sending without waiting buys
(a sender thread over shm, a posted request over HTTP).

One server (``python -m tdreplay.service serve``, one torch thread, memmap)
holding the shipped cartpole (11 fields, ~70 B) and atari (84x84x4 frame
stacks, ~56 KB) schemas, atari at a capacity of 4096 with no ratio limiter
(``common.schemas``), and one client process (one torch thread) with a
client per transport (HTTP and the same-host shared memory). Every case runs
once per round, the writer and its extend back to back in a rotating order;
figures are medians over rounds, ratios the median of per-round ratios.
Figures vary +-25% when other work shares the cores: compare ratios.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from common import entry
from workers import Case, median_of, one_server_main, paired_ratio

CHUNK = 256
TABLES = ("cartpole", "atari")


# ------------------------------------------------------------------ worker side
def make_cases(cfg: dict[str, Any]) -> dict[str, Case]:
    """``{tr}: {t} writer`` and ``{tr}: {t} extend b256`` for every transport and table."""
    import torch
    from tdreplay_cases import rows

    from tdreplay.client import ReplayClient
    from tdreplay.client.chunking import ChunkBuffer

    torch.set_num_threads(1)
    cases: dict[str, Case] = {}
    for t in TABLES:
        fields = {k: (s, d) for k, (s, d) in cfg["fields"][t].items()}
        batch = rows(fields, CHUNK, seed=1)
        steps = [batch[i].clone() for i in range(CHUNK)]

        def buffer_only(buf: Any = ChunkBuffer(CHUNK), steps: list[Any] = steps) -> None:
            for step in steps:
                buf.append(step)
            buf.take(borrow=True)  # what a writer sends from

        cases[f"{t} buffer only"] = Case(buffer_only, CHUNK)
    for tr in cfg["transports"]:
        client = ReplayClient(cfg["url"], transport=tr, timeout=120)
        if client.transport != tr:
            raise RuntimeError(f"asked for transport {tr!r}, got {client.transport!r}")
        for t in TABLES:
            fields = {k: (s, d) for k, (s, d) in cfg["fields"][t].items()}
            batch = rows(fields, CHUNK, seed=1)
            steps = [batch[i].clone() for i in range(CHUNK)]  # each step its own tensors
            writer = client.writer(t, chunk=CHUNK)  # defaults: max_delay 1 s, as users run it

            waiting = client.writer(t, chunk=CHUNK, background=False)  # each answer waited for

            def append(w: Any = writer, steps: list[Any] = steps) -> None:
                for step in steps:
                    w.append(step)

            cases[f"{tr}: {t} writer"] = Case(append, CHUNK, finish=writer.flush)
            cases[f"{tr}: {t} waiting"] = Case(
                lambda w=waiting, a=append: a(w), CHUNK, finish=waiting.flush
            )
            cases[f"{tr}: {t} extend b{CHUNK}"] = Case(
                lambda c=client, t=t, b=batch: c.extend(t, b), CHUNK
            )
    return cases


# ------------------------------------------------------------------ main side
def groups(transports: list[str]) -> list[list[str]]:
    """Each table's writer and its batched extend back to back, per transport."""
    return [
        [f"{tr}: {t} writer", f"{tr}: {t} waiting", f"{tr}: {t} extend b{CHUNK}"]
        for t in TABLES
        for tr in transports
    ] + [[f"{t} buffer only"] for t in TABLES]


def entries(runs: dict[str, list[dict[str, float]]], transports: list[str]) -> list[dict[str, Any]]:
    figures = []
    for t in TABLES:
        for tr in transports:
            ours, base = runs[f"{tr}: {t} writer"], runs[f"{tr}: {t} extend b{CHUNK}"]
            figures.append(
                entry(
                    "writer",
                    f"{t} writer(chunk={CHUNK}), single steps ({tr})",
                    median_of(ours),
                    "items/s",
                    f"extend b{CHUNK}, pre-batched ({tr})",
                    median_of(base),
                    ratio=paired_ratio(ours, base),
                )
            )
            waiting = runs[f"{tr}: {t} waiting"]
            figures.append(
                entry(
                    "writer",
                    f"{t} writer(chunk={CHUNK}, background=False), each answer waited for ({tr})",
                    median_of(waiting),
                    "items/s",
                    f"extend b{CHUNK}, pre-batched ({tr})",
                    median_of(base),
                    ratio=paired_ratio(waiting, base),
                )
            )
            us = statistics.median(r["cpu"] / (r["items_per_s"] * r["wall"]) * 1e6 for r in ours)
            ub = statistics.median(r["cpu"] / (r["items_per_s"] * r["wall"]) * 1e6 for r in base)
            figures.append(
                entry(
                    "writer",
                    f"{t} writer's buffer alone, no sends (ceiling over {tr})",
                    median_of(runs[f"{t} buffer only"]),
                    "items/s",
                    f"extend b{CHUNK}, pre-batched ({tr})",
                    median_of(base),
                )
            )
            figures.append(
                entry(
                    "writer",
                    f"{t} writer(chunk={CHUNK}), client CPU per step ({tr})",
                    us,
                    "us/item",
                    f"extend b{CHUNK}, pre-batched ({tr})",
                    ub,
                )
            )
    return figures


def main(argv: list[str] | None = None) -> int:
    script = Path(__file__).resolve()
    return one_server_main(argv, __doc__, "writer", script, make_cases, groups, entries)


if __name__ == "__main__":
    sys.exit(main())
