"""What telling a retried extend from other rows under its request id costs, per extend.

A server keeps a fingerprint of each extend's rows with its ``X-Request-Id``
(``service/idempotency.py``: ``RowsFingerprint``). This measures it on the
shipped schemas (cartpole, atari; 256 rows, the default memmap backend) beside
what reading every byte would cost (``zlib.crc32``, ``hashlib.blake2b``), and
against the server's CPU per extend of 256 rows: a real server's
``utime + stime`` over many extends through the public client, over HTTP and
over shared memory. Goal: the fingerprint costs at most 2% of it.

    python bench/fingerprint_bench.py            # 3000 cartpole, 300 atari extends a door
    python bench/fingerprint_bench.py --quick    # a tenth of that
Writes bench/results/fingerprint.json (``--json FILE`` elsewhere).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from common import (  # noqa: E402
    bound_entry,
    cpu_seconds,
    entry,
    failed,
    free_port,
    print_entries,
    schemas,
    stop,
    wait_up,
    write_json,
)

from tdreplay.client import ReplayClient  # noqa: E402
from tdreplay.service.idempotency import RowsFingerprint  # noqa: E402

BATCH = 256
Columns = Mapping[Any, torch.Tensor]


def batch(fields: dict[str, tuple[list[int], str]], n: int) -> TensorDict:
    """``n`` rows of random values (frames of random pixels: nothing compresses)."""
    g = torch.Generator().manual_seed(0)
    td = TensorDict(batch_size=[n])
    for key, (shape, dtype) in fields.items():
        value = torch.randint(0, 255, (n, *shape), generator=g, dtype=torch.int64)
        td.set(tuple(key.split(".")), value.to(getattr(torch, dtype)))
    return td


def _bytes(column: torch.Tensor) -> memoryview:
    return column.reshape(-1).view(torch.uint8).numpy().data


def crc32_all(columns: Columns) -> int:
    crc = 0
    for column in columns.values():
        crc = zlib.crc32(_bytes(column), crc)
    return crc


def blake2b_all(columns: Columns) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for column in columns.values():
        digest.update(_bytes(column))
    return digest.digest()


def per_call(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of ``fn()``."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def costs(
    fields: dict[str, tuple[list[int], str]], rows: TensorDict, reps: int
) -> dict[str, float]:
    """Median seconds of each way to fingerprint ``rows``, as a server gets them (flat columns)."""
    columns = {tuple(k.split(".")): v for k, v in rows.flatten_keys(".").items()}
    schema = {tuple(k.split(".")): (s, getattr(torch, d)) for k, (s, d) in fields.items()}
    fingerprint = RowsFingerprint(schema)
    return {
        "RowsFingerprint": per_call(lambda: fingerprint(columns), reps),
        "zlib.crc32, every byte": per_call(lambda: crc32_all(columns), reps),
        "blake2b, every byte": per_call(lambda: blake2b_all(columns), reps),
    }


def server_cpu(url: str, pid: int, name: str, rows: TensorDict, door: str, n: int) -> float:
    """The server's CPU seconds per extend of ``rows`` over ``door``."""
    client = ReplayClient(url, transport=door)
    assert client.transport == door, client.transport
    for _ in range(max(5, n // 20)):
        client.extend(name, rows)
    before = cpu_seconds(pid)
    for _ in range(n):
        client.extend(name, rows)
    spent = cpu_seconds(pid) - before
    client.close()
    return spent / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tenth of the extends")
    p.add_argument("--json", type=Path, default=HERE / "results" / "fingerprint.json")
    args = p.parse_args()
    scale = 10 if args.quick else 1
    entries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tdreplay-fingerprint-") as scratch:
        fields = schemas(Path(scratch) / "schemas")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "tdreplay.service", "serve", "--port", str(port),
               "--root", f"{scratch}/data", "--schema", f"{scratch}/schemas",
               "--log-level", "warning"]  # fmt: skip
        server = subprocess.Popen(cmd, cwd=REPO)
        try:
            wait_up(f"{url}/readyz", server, "tdreplay serve")
            for name, extends in (("cartpole", 3000), ("atari", 300)):
                rows = batch(fields[name], BATCH)
                reps = 20_000 // (scale * (1 if name == "cartpole" else 20))
                cost = costs(fields[name], rows, reps)
                for door in ("http", "shm"):
                    cpu = server_cpu(url, server.pid, name, rows, door, extends // scale)
                    work = f"{name} b{BATCH} ({door})"
                    entries.append(entry("fingerprint", f"{work}: server CPU per extend",
                                         cpu * 1e6, "us"))  # fmt: skip
                    for what, seconds in cost.items():
                        share = 100 * seconds / cpu
                        if what == "RowsFingerprint":
                            entries.append(bound_entry("fingerprint", f"{work}: {what}, % of it",
                                                       share, "%", 2.0, most=True))  # fmt: skip
                        else:
                            entries.append(entry("fingerprint", f"{work}: {what}, % of it",
                                                 share, "%"))  # fmt: skip
                for what, seconds in cost.items():
                    work = f"{name} b{BATCH}: {what}"
                    entries.append(entry("fingerprint", work, seconds * 1e6, "us"))
        finally:
            stop([server])
    print_entries(entries)
    write_json(args.json, "fingerprint", entries)
    return 1 if failed(entries) else 0


if __name__ == "__main__":
    sys.exit(main())
