"""Before/after: the same public-client workloads against two source trees, interleaved.

    python bench/compare_trees.py --before ../old-checkout            # ~3 min
    python bench/compare_trees.py --before ../old-checkout --quick    # ~1 min
    git worktree add /tmp/before <commit>   # one way to get the old tree

For a change that must not cost speed (a refactor): each round starts a
server from each tree (``python -m tdreplay.service serve``, default memmap
backend, the shipped cartpole and atari schemas) and drives it with a client
process of the same tree (``ReplayClient``, decode into TensorDicts
included), the trees taking turns, so both see the same machine load. It
reports the median over rounds of each workload, and the ratio after/before.

The atari schema's rate limiter (samples_per_insert 8) would hold a
benchmark's inserts back; both trees run it with ``min_size_to_sample: 1``
and no ratio, and a capacity of 4096 (its sampler, fields and backend as
shipped).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import free_port, schemas  # bench/ is on sys.path when run as a script

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PACKAGES = ("storage", "service", "client", "codec", "system", "cli")

#: (name, table, op, batch): the workloads, as a learner and a collector run them
WORKLOADS = [
    ("cartpole sample b1", "cartpole", "sample", 1),
    ("cartpole sample b32", "cartpole", "sample", 32),
    ("cartpole sample b256", "cartpole", "sample", 256),
    ("atari sample b32", "atari", "sample", 32),
    ("atari sample b256", "atari", "sample", 256),
    ("cartpole extend b256", "cartpole", "extend", 256),
    ("atari extend b64", "atari", "extend", 64),
]

DRIVER = r"""
import json, sys, time, torch
from tensordict import TensorDict
from tdreplay.client import ReplayClient
url, fields, workloads, seconds, transport = json.loads(sys.argv[1])
try:
    client = ReplayClient(url, transport=transport)
except TypeError:  # a tree from before the transports: HTTP only
    assert transport == "http", "this tree's client has no shared-memory transport"
    client = ReplayClient(url)
def rows(table, n):
    td = TensorDict(batch_size=[n])
    for name, (shape, dtype) in fields[table].items():
        dt = getattr(torch, dtype)
        t = torch.randint(0, 2, [n, *shape]).to(dt)
        td.set(tuple(name.split(".")), t)
    return td
for table in fields:  # fill
    for _ in range(8):
        client.extend(table, rows(table, 256))
out = {}
for name, table, op, batch in workloads:
    if op == "sample":
        call = lambda: client.sample(table, batch)
    else:
        data = rows(table, batch)
        call = lambda: client.extend(table, data)
    call()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        call()
        n += 1
    out[name] = n * batch / (time.perf_counter() - t0)
print(json.dumps(out))
"""


def namespace(tree: Path, into: Path) -> Path:
    """A folder whose ``tdreplay/`` maps onto ``tree``'s packages (put it first on PYTHONPATH)."""
    pkg = into / "tdreplay"
    pkg.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        link, target = pkg / name, tree.resolve() / name
        if target.exists() and not os.path.lexists(link):  # an older tree lacks the newer packages
            link.symlink_to(target)
    return into


def run_tree(
    tree: Path, work: Path, fields: dict, seconds: float, transport: str
) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(namespace(tree, work / "ns"))}
    port = free_port()
    root = tempfile.mkdtemp(dir=work)
    server = subprocess.Popen(
        [sys.executable, "-m", "tdreplay.service", "serve", "--schema", str(work / "schemas"),
         "--root", root, "--port", str(port), "--log-level", "warning"],
        env=env, cwd=work,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server of {tree} did not come up") from None
                time.sleep(0.2)
        arg = json.dumps([url, fields, WORKLOADS, seconds, transport])
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, arg], env=env, cwd=work, capture_output=True, text=True
        )
        if done.returncode:
            raise RuntimeError(f"the client of {tree} failed:\n{done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(30)


def _portable(argv: list[str]) -> list[str]:
    """``argv`` with the trees named by their commits, not by where they lie on this machine."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg in ("--before", "--after"):
            rev = subprocess.run(
                ["git", "-C", out[i + 1], "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            out[i + 1] = f"<checkout of {rev or 'the old tree'}>"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the old source tree")
    parser.add_argument("--after", type=Path, default=REPO, help="the new one (default: this one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="per workload and round")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 1 s")
    parser.add_argument(
        "--transport",
        default="http",
        choices=["http", "auto", "shm"],
        help="the client's transport in both trees (a tree without one runs HTTP)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 3, 1.0
    results: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trees = {}
        for side in ("before", "after"):
            (work / side / "schemas").mkdir(parents=True)
            trees[side] = (getattr(args, side), work / side)
        fields = {}
        for _, folder in trees.values():
            fields = schemas(folder / "schemas")
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for side in order:
                tree, folder = trees[side]
                rates = run_tree(tree, folder, fields, args.seconds, args.transport)
                for name, rate in rates.items():
                    results[side].setdefault(name, []).append(rate)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    rows = []
    print(f"{'workload':<24} {'before items/s':>15} {'after items/s':>15} {'after/before':>13}")
    for name, *_ in WORKLOADS:
        b = statistics.median(results["before"][name])
        a = statistics.median(results["after"][name])
        rows.append({"workload": name, "before": b, "after": a, "ratio": a / b})
        print(f"{name:<24} {b:>15,.0f} {a:>15,.0f} {a / b:>13.2f}")
    if args.json:
        command = " ".join(["python", "bench/compare_trees.py", *_portable(sys.argv[1:])])
        out = {"command": command, "rounds": args.rounds, "results": rows}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
