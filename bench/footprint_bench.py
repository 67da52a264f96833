"""What a table costs on disk and in memory, and how long a server takes to stop and reopen.

Real servers (``python -m tdreplay.service serve``) on the shipped schemas and
the default backend (memmap), filled through the public client; TorchRL's
``LazyMemmapStorage`` (files created at the first write, grown as written) on
the same items beside it where a figure exists for it.

* **disk at ready**: ``make serve``'s command on a fresh root, bytes held under
  it at ``/readyz`` (disk blocks, not file sizes), with the default (extents)
  and with ``--preallocate`` (the whole capacity, what every server did before).
* **disk per 1,000 rows**: bytes the root grows by per 1,000 rows extended.
* **server RSS**: empty (a 1M-row cartpole table created) and holding 1M rows.
* **stop**: SIGTERM to exit, ``--checkpoint-on-shutdown``, with a full atari
  table: memmap tables are skipped; ``--checkpoint-durable`` copies them (before).
* **reopen**: start to ``/readyz`` with a full atari table and with a 10M-row
  cartpole table (after a ``sync``: the fill's writeback is not the reopen's), and
  the server's RSS then (bookkeeping, not rows). A server's start with nothing to
  reopen is ~2.8 s here (imports: torch and tensordict take 2.5 s).

    python bench/footprint_bench.py            # full: a 100k-row atari table (5.6 GB), 10M cartpole rows
    python bench/footprint_bench.py --quick    # 10k atari rows, 1M cartpole rows
Writes bench/results/footprint.json (``--json FILE`` elsewhere). Everything it
writes is under a scratch folder, deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from tensordict import TensorDict

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from common import bound_entry, entry, free_port, print_entries, wait_up, write_json  # noqa: E402

from tdreplay.client import ReplayClient  # noqa: E402

MB = 1 << 20


def held(root: Path) -> int:
    """Bytes of disk blocks the files under ``root`` hold."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            total += st.st_blocks * 512
    return total


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


class Server:
    def __init__(self, root: Path, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "tdreplay.service", "serve", "--root", str(root),
               "--port", str(self.port), "--log-level", "warning", *flags]  # fmt: skip
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, cwd=REPO)
        wait_up(f"{self.url}/readyz", self.proc, "tdreplay serve", timeout=600)
        self.ready_s = time.perf_counter() - self.started

    def stop(self) -> float:
        """SIGTERM; seconds until the process exited."""
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(600)
        return time.perf_counter() - t0


def spec_of(name: str, capacity: int) -> dict[str, Any]:
    spec = yaml.safe_load((REPO / "schemas" / f"{name}.yaml").read_text())
    spec["capacity"] = capacity
    spec["rate_limiter"] = {"min_size_to_sample": 1}
    return spec


def rows_of(spec: dict[str, Any], n: int) -> TensorDict:
    td = TensorDict(batch_size=[n])
    for key, f in spec["fields"].items():
        dtype = getattr(torch, f["dtype"])
        shape = (n, *f["shape"])
        value = (
            torch.randint(0, 255, shape).to(dtype)
            if dtype != torch.bool
            else torch.zeros(shape, dtype=torch.bool)
        )
        td.set(tuple(key.split(".")), value)
    return td


def fill(client: ReplayClient, name: str, spec: dict[str, Any], n: int, chunk: int) -> None:
    batch = rows_of(spec, chunk)
    done = 0
    while done < n:
        k = min(chunk, n - done)
        client.extend(name, batch[:k])
        done += k


def filled(root: Path, name: str, n: int, chunk: int) -> int:
    """A server on ``root`` holding a full ``n``-row table of a shipped schema, stopped;
    the bytes its root holds."""
    server = Server(root)
    client = ReplayClient(server.url, transport="http")
    spec = spec_of(name, n)
    client.create_table(spec)
    fill(client, name, spec, n, chunk)
    server.stop()
    os.sync()  # a reopen measures the table's load, not the fill's writeback still under way
    return held(root)


def torchrl_disk_per_1000(spec: dict[str, Any], n: int, scratch: Path) -> float:
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    where = scratch / "torchrl"
    rb = ReplayBuffer(storage=LazyMemmapStorage(spec["capacity"], scratch_dir=str(where)))
    rb.extend(rows_of(spec, 1))  # the files appear at the first write
    start = held(where)
    fill_rb = rows_of(spec, min(n, 1024))
    done = 0
    while done < n:
        k = min(len(fill_rb), n - done)
        rb.extend(fill_rb[:k])
        done += k
    per = (held(where) - start) / n * 1000
    del rb
    shutil.rmtree(where, ignore_errors=True)
    return per


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", type=Path, default=HERE / "results" / "footprint.json")
    args = p.parse_args(argv)
    atari_rows = 10_000 if args.quick else 100_000
    cartpole_big = 1_000_000 if args.quick else 10_000_000
    scratch = Path(tempfile.mkdtemp(prefix="tdreplay-footprint-"))
    entries: list[dict[str, Any]] = []
    b = "footprint"
    t_all = time.perf_counter()
    try:
        # -- disk at ready, make serve's command ---------------------------------
        ready = {}
        for how, flags in (("extents", []), ("preallocate", ["--preallocate"])):
            root = scratch / f"ready-{how}"
            server = Server(
                root, "--schema", "schemas/", "--restore", "--checkpoint-on-shutdown", *flags
            )
            ready[how] = held(root)
            server.stop()
            shutil.rmtree(root)
        entries.append(
            bound_entry(
                b,
                "disk at ready, make serve (shipped schemas)",
                ready["extents"] / MB,
                "MB",
                100,
                most=True,
            )
        )
        entries.append(
            entry(
                b,
                "disk at ready, make serve --preallocate (before)",
                ready["preallocate"] / MB,
                "MB",
            )
        )

        # -- disk per 1,000 rows, RSS ------------------------------------------
        root = scratch / "rows"
        server = Server(root)
        client = ReplayClient(server.url, transport="http")
        per = {}
        for name, n, chunk in (("cartpole", 100_000, 10_000), ("atari", 4_000, 256)):
            spec = spec_of(name, 100_000)
            client.create_table(spec)
            before = held(root)
            fill(client, name, spec, n, chunk)
            per[name] = (held(root) - before) / n * 1000
            base = torchrl_disk_per_1000(spec, n, scratch)
            entries.append(entry(b, f"disk per 1,000 {name} rows ({n:,} rows, the extent ahead included)", per[name] / MB, "MB",
                                 "TorchRL LazyMemmapStorage", base / MB))  # fmt: skip
            client.delete_table(name)
        server.stop()
        shutil.rmtree(root)
        server = Server(root)  # a fresh one: nothing of the tables above in its heap
        client = ReplayClient(server.url, transport="http")
        spec = spec_of("cartpole", 1_000_000)
        client.create_table(spec)
        time.sleep(0.5)
        empty = rss(server.proc.pid)
        fill(client, "cartpole", spec, 1_000_000, 50_000)
        full = rss(server.proc.pid)
        entries.append(entry(b, "server RSS, empty 1M-row cartpole table", empty / MB, "MB"))
        entries.append(entry(b, "server RSS, 1M cartpole rows", full / MB, "MB"))
        server.stop()
        shutil.rmtree(root)

        # -- stop and reopen with a full atari table ---------------------------
        root = scratch / "atari"
        on_disk = filled(root, "atari", atari_rows, 256)
        stop, reopen = {}, {}
        for how in ("skipped", "durable"):  # reopened, then stopped with --checkpoint-on-shutdown
            extra = ["--checkpoint-durable"] if how == "durable" else []
            server = Server(root, "--checkpoint-on-shutdown", *extra)
            reopen[how] = server.ready_s
            stop[how] = server.stop()
            shutil.rmtree(root / "checkpoints", ignore_errors=True)
        reopen_s = min(reopen.values())
        server = Server(root)
        reopened_rss = rss(server.proc.pid)
        size = ReplayClient(server.url, transport="http").info("atari")["size"]
        assert size == atari_rows, size
        server.stop()
        shutil.rmtree(root)
        label = f"{atari_rows // 1000}k-row atari table ({on_disk / 1e9:.1f} GB)"
        entries.append(
            bound_entry(
                b, f"stop (SIGTERM to exit), full {label}", stop["skipped"], "s", 5, most=True
            )
        )
        entries.append(
            entry(b, f"stop with --checkpoint-durable (before), full {label}", stop["durable"], "s")
        )
        entries.append(
            bound_entry(b, f"reopen (start to ready), full {label}", reopen_s, "s", 5, most=True)
        )
        entries.append(entry(b, f"server RSS after reopen, full {label}", reopened_rss / MB, "MB"))

        # -- reopen a big cartpole table ---------------------------------------
        root = scratch / "cartpole"
        on_disk = filled(root, "cartpole", cartpole_big, 100_000)
        server = Server(root)
        reopened_rss = rss(server.proc.pid)
        server.stop()
        shutil.rmtree(root)
        label = f"{cartpole_big / 1e6:g}M-row cartpole table ({on_disk / 1e9:.2f} GB on disk, {on_disk / cartpole_big:.0f} B/row)"
        entries.append(
            bound_entry(b, f"reopen (start to ready), {label}", server.ready_s, "s", 5, most=True)
        )
        entries.append(entry(b, f"server RSS after reopen, {label}", reopened_rss / MB, "MB"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_entries(entries)
    write_json(
        args.json, "footprint", entries, quick=args.quick, wall_s=time.perf_counter() - t_all
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
