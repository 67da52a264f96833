"""GPU check (issue 24 item 6): ``loader(device=...)`` over HTTP and shared memory, and a
writer fed from device tensors, against a real server this script starts.

The server (``python -m tdreplay.service serve --seed 7``, memory tables) holds twin
tables filled alike: ``dev`` by a writer appending steps and row blocks that live on
the device, ``cpu`` by plain extends of the same rows from the CPU. Every table of a
seeded server starts its sampling generator from the seed, so the twins draw the same
items as long as they are sampled alike.

Checks (PASS / FAIL, in the JSON under ``checks``):

* ``writer``: the writer fed from device tensors stored the same bytes as the CPU
  extends (the twins' Parquet exports are equal).
* ``identical <way>``: for each way - ``http``, ``shm`` (batches copied from the shared
  slot into the loader's pinned staging) and ``http stream`` (the ``/stream`` route) -
  ``--batches`` batches through ``loader(device=DEVICE)`` of ``dev`` and through
  ``loader()`` (CPU) of ``cpu`` are the same batches, bit for bit, every leaf on DEVICE.
  They are compared as multisets: prefetch threads may hand batches over in another
  order than the server drew them.
* ``never blocks <way>``: with a learner slower than the fetchers (batches ready), its
  median time in ``next()`` stays under half a blocking copy of one batch: copies run
  on the fetchers' side stream (``non_blocking`` from pinned staging) and the learner's
  stream only waits on their event.

Figures (``entries``, as every benchmark's, ``bench/common.py``): batches through
``loader(device)`` against ``loader()`` plus a plain ``batch.to(device)`` in the learner
loop (GB/s of batch bytes, end to end), and the raw copy: pinned ``non_blocking`` copies
on a side stream against plain ``.to(device)`` of the same batches.

    python bench/gpu_check.py                        # CUDA; without it: a message, exit 0
    python bench/gpu_check.py --device cpu --quick   # the same logic on a CPU "device"
    python bench/gpu_check.py --json bench/results/gpu.json

Exit status: 0 every check passed (or CUDA is absent: skipped, said so); 1 one failed.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from common import entry, free_port, print_entries, stop, wait_up, write_json  # noqa: E402

SEED = 7
ROUNDS = 5  # interleaved runs of each way in loader_rates (medians reported)
#: what a learner's next() may vary by on a busy host (thread hand-overs), in seconds; on
#: the CPU no copy is made at all (the batch stays in the loader's buffer): there the check
#: only exercises the measurement, whose resolution is a loaded host's hand-over noise
FLOOR = {"cuda": 0.5e-3, "cpu": 2e-3}
WAYS = [("http", False), ("shm", False), ("http", True)]  # (transport, stream)


def spec(name: str, capacity: int, frames: int) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": capacity,
        "fields": {
            "pixels": {"shape": [frames, 84, 84], "dtype": "uint8"},
            "observation": {"shape": [8], "dtype": "float32"},
            "action": {"shape": [], "dtype": "int64"},
            "logits": {"shape": [4], "dtype": "bfloat16"},
            "next.reward": {"shape": [1], "dtype": "float32"},
            "next.done": {"shape": [1], "dtype": "bool"},
        },
        "backend": {"kind": "memory"},
    }


def make_rows(n: int, frames: int) -> TensorDict:
    g = torch.Generator().manual_seed(SEED)
    return TensorDict(
        {
            "pixels": torch.randint(0, 256, (n, frames, 84, 84), generator=g, dtype=torch.uint8),
            "observation": torch.randn(n, 8, generator=g),
            "action": torch.randint(0, 4, (n,), generator=g),
            "logits": torch.randn(n, 4, generator=g).bfloat16(),
            "next": {
                "reward": torch.randn(n, 1, generator=g),
                "done": torch.rand(n, 1, generator=g) < 0.1,
            },
        },
        [n],
    )


def digest(batch: Any) -> str:
    """Every leaf's key, dtype and bytes (read back to the CPU), hashed."""
    h = hashlib.sha256()
    for key in sorted(batch.keys(include_nested=True, leaves_only=True), key=str):
        t = batch.get(key).detach().cpu().contiguous()
        h.update(f"{key}{t.dtype}{list(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def leaves_on(batch: Any, dev: torch.device) -> bool:
    leaves = batch.values(include_nested=True, leaves_only=True)
    return all(t.device.type == dev.type for t in leaves)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def nbytes(batch: Any) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values(True, True))


def fill(client: Any, rows: TensorDict, dev: torch.device) -> None:
    """``dev``: a writer fed from device tensors (steps one by one, then row blocks);
    ``cpu``: plain extends of the same rows."""
    n = len(rows)
    for start in range(0, n, 256):
        client.extend("cpu", rows[start : start + 256])
    on_dev = rows.to(dev)
    with client.writer("dev", chunk=256) as writer:
        for i in range(n // 2):
            writer.append(on_dev[i])  # a step (batch [])
        for start in range(n // 2, n, 100):
            writer.append(on_dev[start : start + 100])  # rows (batch [k])


def identical(client: Any, dev: torch.device, args: Any, stream: bool) -> dict[str, Any]:
    """The same draws through ``loader(device=dev)`` (table ``dev``) and ``loader()`` (``cpu``)."""
    kw = {"prefetch": 4, "num_batches": args.batches, "stream": stream}
    on_dev, on_dev_ok = [], True
    for batch in client.loader("dev", args.batch, device=dev, **kw):
        on_dev_ok = on_dev_ok and leaves_on(batch, dev)
        on_dev.append(digest(batch))
    on_cpu = [digest(b) for b in client.loader("cpu", args.batch, **kw)]
    same = Counter(on_dev) == Counter(on_cpu) and len(on_dev) == args.batches
    return {
        "pass": bool(same and on_dev_ok),
        "batches": len(on_dev),
        "same_batches": same,
        "leaves_on_device": on_dev_ok,
        "in_draw_order": on_dev == on_cpu,
    }


def blocking_copy_s(client: Any, dev: torch.device, args: Any) -> float:
    """Median seconds of one blocking copy of a batch (plain ``.to`` from pageable memory;
    on the CPU, a clone)."""
    batch = client.sample("cpu", args.batch).clone()
    times = []
    for _ in range(5):
        began = time.perf_counter()
        _ = batch.clone() if dev.type == "cpu" else batch.to(dev)
        sync(dev)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def learner_waits(client: Any, dev: torch.device | None, args: Any, stream: bool,
                  work: float) -> list[float]:  # fmt: skip
    """Seconds of each ``next()`` of a learner working ``work`` s a batch (so batches are ready)."""
    loader = client.loader("dev", args.batch, prefetch=4, device=dev, stream=stream,
                           num_batches=args.batches + 1)  # fmt: skip
    it = iter(loader)
    next(it)
    time.sleep(10 * work)  # the fetchers fill the prefetch
    waits = []
    while True:
        began = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return waits
        waits.append(time.perf_counter() - began)
        if dev is not None and dev.type == "cuda":  # the learner's step: GPU work, no host sync
            batch["observation"].float().sum()
        time.sleep(work)


def never_blocks(client: Any, dev: torch.device, args: Any, stream: bool, copy_s: float,
                 fetch_s: float) -> dict[str, Any]:  # fmt: skip
    """The learner's time in ``next()`` while batches are ready, through ``loader(device)``,
    beyond its time through ``loader()`` (no copy at all): under half a blocking copy of a
    batch, or under ``FLOOR`` (what thread hand-overs on a busy host vary by)."""
    work = min(0.02, max(0.005, 3 * fetch_s))
    base = statistics.median(learner_waits(client, None, args, stream, work))
    waits = learner_waits(client, dev, args, stream, work)
    median = statistics.median(waits)
    return {
        "pass": median - base < max(0.5 * copy_s, FLOOR.get(dev.type, FLOOR["cuda"])),
        "next_median_ms": median * 1e3,
        "next_p90_ms": sorted(waits)[int(0.9 * (len(waits) - 1))] * 1e3,
        "next_without_copy_median_ms": base * 1e3,
        "blocking_copy_ms": copy_s * 1e3,
        "learner_work_ms": work * 1e3,
    }


def loader_rates(client: Any, dev: torch.device, args: Any, stream: bool) -> tuple[float, float]:
    """Bytes/s of batches through ``loader(device)``, and through ``loader()`` + a plain
    ``.to(dev)`` (a clone on the CPU); medians of ``ROUNDS`` runs each, interleaved."""
    rates: list[list[float]] = [[], []]
    for _ in range(ROUNDS):
        for i, to_device in enumerate((True, False)):
            moved = 0
            kw = {"prefetch": 4, "num_batches": args.batches, "stream": stream}
            began = time.perf_counter()
            for batch in client.loader("dev", args.batch, device=dev if to_device else None, **kw):
                if not to_device:
                    batch = batch.to(dev) if dev.type == "cuda" else batch.clone()
                moved += nbytes(batch)
            sync(dev)
            rates[i].append(moved / (time.perf_counter() - began))
    return statistics.median(rates[0]), statistics.median(rates[1])


def copy_rates(client: Any, dev: torch.device, args: Any) -> tuple[float, float]:
    """Bytes/s of pinned ``non_blocking`` copies on a side stream, and of plain ``.to``."""
    batches = [client.sample("cpu", args.batch).clone() for _ in range(min(args.batches, 8))]
    total = sum(nbytes(b) for b in batches)
    cuda = dev.type == "cuda"
    pinned = [b.pin_memory() for b in batches] if cuda else batches
    side = torch.cuda.Stream(dev) if cuda else None
    out = []
    for fast in (True, False, True, False):  # the first two warm up
        began = time.perf_counter()
        for _ in range(3):
            for b in pinned if fast else batches:
                if side is not None and fast:
                    with torch.cuda.stream(side):
                        b.apply(lambda t: t.to(dev, non_blocking=True, copy=True))
                else:
                    b.apply(lambda t: t.to(dev, copy=True))
            if side is not None and fast:
                side.synchronize()
            sync(dev)
        out.append(3 * total / (time.perf_counter() - began))
    return out[2], out[3]


def start_server(root: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "tdreplay.service", "serve", "--port", str(port), "--root",
           str(root), "--seed", str(SEED), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(f"{url}/healthz", proc, "tdreplay server")
    except BaseException:  # ended before the caller's cleanup removes its root: none left behind
        stop([proc])
        raise
    return proc, url


def attempt(checks: dict[str, Any], name: str, check: Any, *args: Any) -> Any:
    """``check(*args)`` as check ``name``; an error is that check's FAIL (the rest go on)."""
    try:
        checks[name] = result = check(*args)
    except Exception as err:
        checks[name] = {"pass": False, "error": f"{type(err).__name__}: {err}"}
        return None
    return result


def fill_and_compare(http: Any, dev: torch.device, capacity: int, frames: int) -> dict[str, Any]:
    """The twins filled (:func:`fill`), and the writer's rows compared with the extends'."""
    try:
        fill(http, make_rows(capacity, frames), dev)
    except Exception as err:  # the loader checks still run, on rows extended from the CPU
        http.clear("dev")
        http.clear("cpu")
        rows = make_rows(capacity, frames)
        for table in ("dev", "cpu"):
            http.extend(table, rows)
        return {"pass": False, "error": f"{type(err).__name__}: {err}"}
    stored = [[digest(http.read(t, list(range(i, min(i + 256, capacity)))))
               for i in range(0, capacity, 256)] for t in ("dev", "cpu")]  # fmt: skip
    return {"pass": stored[0] == stored[1], "rows": capacity}


def run(dev: torch.device, args: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from tdreplay.client import ReplayClient
    from tdreplay.client.shm import ShmUnavailable

    frames = 1 if args.quick else 4
    capacity = 256 if args.quick else 2048
    root = Path(tempfile.mkdtemp(prefix="tdreplay-gpu-check-"))
    procs: list[subprocess.Popen] = []
    checks: dict[str, Any] = {}
    entries: list[dict[str, Any]] = []
    try:
        proc, url = start_server(root / "data")
        procs.append(proc)
        http = ReplayClient(url, transport="http")
        for name in ("dev", "cpu"):
            http.create_table(spec(name, capacity, frames))
        checks["writer"] = fill_and_compare(http, dev, capacity, frames)
        clients: dict[str, Any] = {"http": http}
        try:
            clients["shm"] = ReplayClient(url, transport="shm")
            clients["shm"].info("dev")
        except ShmUnavailable as err:
            clients.pop("shm", None)
            checks["identical shm"] = {"pass": None, "skipped": str(err)}
        ways = [(t, s, t + (" stream" if s else "")) for t, s in WAYS if t in clients]
        for transport, stream, way in ways:  # first: the twins draw alike until measured
            attempt(checks, f"identical {way}", identical, clients[transport], dev, args, stream)
        copy_s = blocking_copy_s(http, dev, args)
        batch_bytes = nbytes(http.sample("cpu", args.batch))
        for transport, stream, way in ways:
            client = clients[transport]
            rates = attempt(checks, f"rates {way}", loader_rates, client, dev, args, stream)
            if rates is None:
                continue
            del checks[f"rates {way}"]
            fast, plain = rates
            fetch_s = batch_bytes / plain  # seconds a batch takes the fetchers, at most
            attempt(checks, f"never blocks {way}", never_blocks, client, dev, args, stream,
                    copy_s, fetch_s)  # fmt: skip
            entries.append(entry("gpu", f"loader b{args.batch} ({way}) to {dev.type}",
                                 fast / 1e9, "GB/s", "loader() + plain .to(device)", plain / 1e9))  # fmt: skip
        pinned, plain = copy_rates(http, dev, args)
        entries.append(entry("gpu", f"copy b{args.batch} to {dev.type}", pinned / 1e9, "GB/s",
                             "plain .to(device)", plain / 1e9))  # fmt: skip
    finally:
        stop(procs)
        shutil.rmtree(root, ignore_errors=True)
    return checks, entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--batch", type=int, default=None, help="items per batch")
    parser.add_argument("--batches", type=int, default=None, help="batches per comparison")
    parser.add_argument("--quick", action="store_true", help="a small table, few batches")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    args.batch = args.batch or (32 if args.quick else 512)
    args.batches = args.batches or (8 if args.quick else 32)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        reason = "CUDA is not available (torch.cuda.is_available() is False): not run on a GPU"
        print(f"gpu_check skipped: {reason}; `--device cpu` runs the same checks on the CPU")
        if args.json:
            write_json(args.json, "gpu", [], device=str(dev), skipped=reason, checks={})
        return 0
    checks, entries = run(dev, args)
    print_entries(entries)
    print("\nchecks:")
    for name, result in checks.items():
        mark = {True: "PASS", False: "FAIL", None: "SKIP"}[result["pass"]]
        detail = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
        print(f"  {mark}  {name}: {detail}")
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    ok = all(r["pass"] is not False for r in checks.values())
    if args.json:
        write_json(args.json, "gpu", entries, device=str(dev), gpu=gpu, checks=checks, ok=ok)
    print(f"\n{'all checks passed' if ok else 'a check FAILED'} on {gpu or dev}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
