"""DeepMind Reverb's side of ``bench/peers_bench.py``: its server, and a worker timing its client.

Runs in the peers environment (``make bench-peers`` builds ``.venv-peers``
with ``dm-reverb`` and TensorFlow), never in tdreplay's::

    .venv-peers/bin/python bench/reverb_peer.py serve PORT TABLES_JSON   # the server process
    .venv-peers/bin/python bench/reverb_peer.py worker                   # a client process

The tables mirror tdreplay's (``bench/common.py`` ``schemas``): the same
fields, shapes and dtypes as one-step items (a TED transition per item),
the same capacity, Reverb's ``Uniform`` or ``Prioritized(0.6)`` selector
where the tdreplay schema has ``uniform`` or ``prioritized``, a ``Fifo``
remover and ``MinSize(1)``. The sampled table ``{t}`` is filled once with
chunks of one step (a sample fetches and decompresses the whole chunk its
item lies in: Reverb's fastest sampling of one-step items); the timed
writers write to tables of their own, ``{t}_w`` (the trajectory writer) and
``{t}_seq`` (the legacy ``Writer``'s items, with a leading time dimension
of 1), so their chunking does not touch the sampled table.

Cases (names as the driver asks for them)::

    reverb: {t} sample b1        list(client.sample(t, 1)): one call per batch
    reverb: {t} stream b1        next() on one client.sample(t, num_samples=huge) generator,
                                 Reverb's sample stream (faster than tf.data at batch 1)
    reverb: {t} dataset b{n}     TrajectoryDataset.from_table_signature(...).batch(n)
                                 .prefetch(4), read as numpy: Reverb's batched sample path
    reverb: {t} trajectory_writer  256 x (append, create_item of the last step), flush;
                                 constant chunks of 16 steps (the fastest of 1, 16, 64, 256
                                 and auto-tuned when measured, by 5-20%)
    reverb: {t} writer           the legacy client.writer(max_sequence_length=1): 256 x
                                 (append, create_item), flush (faster than the trajectory
                                 writer for 11-field items: its per-column Python work)

Batches are returned as Reverb gives them (numpy arrays): a PyTorch learner
would still wrap them (``torch.from_numpy``), which these figures leave out.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from workers import Case, serve_worker

TRAJECTORY_CHUNK = 16
STEPS = 256  # steps per writer call, as tdreplay's writer(chunk=256)
PREFETCH = 4
FILL = {"cartpole": 10_000, "atari": 4096}


def tables(spec: dict[str, Any]) -> list[Any]:
    import reverb
    import tensorflow as tf

    out = []
    for name, t in spec.items():
        for suffix, lead in (("", []), ("_w", []), ("_seq", [1])):
            selector = (
                reverb.selectors.Prioritized(t.get("alpha", 0.6))
                if t["sampler"] == "prioritized"
                else reverb.selectors.Uniform()
            )
            signature = {k: tf.TensorSpec([*lead, *s], d) for k, (s, d) in t["fields"].items()}
            out.append(
                reverb.Table(
                    name + suffix,
                    sampler=selector,
                    remover=reverb.selectors.Fifo(),
                    max_size=t["capacity"],
                    rate_limiter=reverb.rate_limiters.MinSize(1),
                    signature=signature,
                )
            )
    return out


def serve(port: int, spec: dict[str, Any]) -> None:
    import reverb

    server = reverb.Server(tables(spec), port=port)
    server.wait()


def steps(fields: dict[str, Any], n: int) -> list[dict[str, Any]]:
    import numpy as np

    rng = np.random.default_rng(1)
    cols = {}
    for k, (shape, dtype) in fields.items():
        if dtype == "bool":
            cols[k] = rng.random([n, *shape]) < 0.05
        elif dtype.startswith("float"):
            cols[k] = rng.standard_normal([n, *shape]).astype(dtype)
        else:
            cols[k] = rng.integers(0, 255, [n, *shape]).astype(dtype)
    return [{k: v[i] for k, v in cols.items()} for i in range(n)]


def trajectory_writer(client: Any, keys: list[str], chunk: int) -> Any:
    """A ``TrajectoryWriter`` with constant chunks of ``chunk`` steps in every column."""
    writer = client.trajectory_writer(num_keep_alive_refs=chunk)
    for k in keys:
        writer.configure((k,), num_keep_alive_refs=chunk, max_chunk_length=chunk)
    return writer


def make_cases(cfg: dict[str, Any]) -> dict[str, Case]:
    import reverb

    address = cfg["address"]
    client = reverb.Client(address)
    spec = cfg["tables"]
    data = {t: steps(s["fields"], STEPS) for t, s in spec.items()}
    cases: dict[str, Case] = {}
    for t, s in spec.items():
        keys = list(s["fields"])

        def trajectory(w: Any, table: str, t: str = t, keys: list = keys) -> None:
            for step in data[t]:
                w.append(step)
                w.create_item(table, 1.0, {k: w.history[k][-1] for k in keys})
            w.flush()

        # The sampled table is filled once, before any case, in chunks of one step: a
        # sample fetches (and decompresses) the whole chunk that holds its item, so longer
        # chunks would slow Reverb's sampling of one-step items down
        fill = trajectory_writer(client, keys, 1)
        for _ in range(0, FILL[t], STEPS):
            trajectory(fill, t)
        fill.close()
        # the timed writers write to tables of their own, with the chunks best for writing
        traj = trajectory_writer(client, keys, TRAJECTORY_CHUNK)
        cases[f"reverb: {t} trajectory_writer"] = Case(
            lambda w=traj, t=t, write=trajectory: write(w, f"{t}_w"), STEPS
        )

        legacy = client.writer(max_sequence_length=1)

        def write(w: Any = legacy, t: str = t) -> None:
            for step in data[t]:
                w.append(step)
                w.create_item(f"{t}_seq", 1, 1.0)
            w.flush()

        cases[f"reverb: {t} writer"] = Case(write, STEPS)
        for n in s["per_call"]:
            cases[f"reverb: {t} sample b{n}"] = Case(
                lambda t=t, n=n: list(client.sample(t, n, emit_timesteps=False)), n
            )
        for n in s["streams"]:
            gen = client.sample(t, num_samples=2**62, emit_timesteps=False)
            cases[f"reverb: {t} stream b{n}"] = Case(lambda g=gen: next(g), 1)
        for n in s["datasets"]:
            ds = reverb.TrajectoryDataset.from_table_signature(
                address, t, max_in_flight_samples_per_worker=max(2 * n, 16)
            )
            it = ds.batch(n, drop_remainder=True).prefetch(PREFETCH).as_numpy_iterator()
            cases[f"reverb: {t} dataset b{n}"] = Case(lambda it=it: next(it), n)
    return cases


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def hello() -> dict[str, Any]:
    return {
        "side": "reverb",
        "versions": {
            p: v
            for p in ("dm-reverb", "tensorflow-cpu", "tensorflow", "numpy")
            if (v := _version(p)) is not None
        },
    }


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), json.loads(sys.argv[3]))
    else:
        serve_worker(make_cases, hello())
