"""A load larger than the server's body limit: in parts against one request (issue 21 item 1).

Two real servers (``python -m tdreplay.service serve``, memory tables): one
whose ``--max-body-bytes`` (512 MiB) takes the whole archive in one request,
one whose limit is 16 MiB, so the same archive goes up in parts (``load/begin``,
``load/part``... ``load/commit``). The table holds ``--mb`` megabytes of rows
(a 1024-float32 observation per row, prioritized sampler). Figures: the wall
time of ``client.load_archives`` in parts (best of three) against one raw
``POST .../load`` of the same bytes to the first server, and the archive's
size as a multiple of the 16 MiB limit.

    python bench/load_bench.py              # a 256 MB table: the archive is ~16x the limit
    python bench/load_bench.py --quick      # a 64 MB table (4x the limit)

Writes bench/results/load.json (``--json FILE`` elsewhere). Its servers' roots are
under a scratch folder, deleted at the end.
"""

from __future__ import annotations

import argparse
import http.client
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from common import entry, free_port, print_entries, stop, wait_up, write_json  # noqa: E402

MB = 1 << 20
OBS = 1024  # float32 elements per row: 4 KiB
PART = 16 * MB


def serve(root: Path, limit: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "tdreplay.service", "serve", "--port", str(port), "--root",
           str(root), "--log-level", "warning", "--no-shm", "--max-body-bytes", str(limit)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO)
    wait_up(f"http://127.0.0.1:{port}/healthz", proc, "tdreplay server")
    return proc, port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mb", type=int, default=256, help="megabytes of rows")
    parser.add_argument("--quick", action="store_true", help="a 64 MB table")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "load.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.mb = 64

    import torch
    from tensordict import TensorDict

    from tdreplay.client import ReplayClient
    from tdreplay.codec import protocol

    rows = max(2048, args.mb * MB // (OBS * 4)) // 2048 * 2048
    spec = {
        "name": "m",
        "capacity": rows,
        "fields": {"id": {"shape": [], "dtype": "int64"}, "obs": {"shape": [OBS], "dtype": "float32"}},
        "backend": {"kind": "memory"},
        "sampler": {"kind": "prioritized"},
    }  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix="tdreplay-load-bench-"))
    procs: list[subprocess.Popen] = []
    try:
        whole, whole_port = serve(scratch / "whole", 512 * MB)
        parts, parts_port = serve(scratch / "parts", PART)
        procs += [whole, parts]
        source = ReplayClient(f"http://127.0.0.1:{whole_port}", transport="http")
        source.create_table(spec)
        for start in range(0, rows, 2048):
            ids = torch.arange(start, start + 2048)
            source.extend("m", TensorDict({"id": ids, "obs": torch.randn(2048, OBS)}, [2048]))
        archive = source.dump_archives("m")[0]
        one = []
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", whole_port, timeout=600)
            began = time.perf_counter()
            conn.request("POST", protocol.table_path("m", "load"), archive,
                         {"Content-Type": protocol.TAR})  # fmt: skip
            answer = conn.getresponse()
            answer.read()
            one.append(time.perf_counter() - began)
            conn.close()
            assert answer.status == 200, answer.status
        client = ReplayClient(f"http://127.0.0.1:{parts_port}", transport="http")
        split = []
        for _ in range(3):
            began = time.perf_counter()
            client.load_archives("m", [archive])
            split.append(time.perf_counter() - began)
        assert client.info("m")["size"] == rows
    finally:
        stop(procs)
        shutil.rmtree(scratch, ignore_errors=True)
    times = len(archive) / PART
    what = f"load of {len(archive) / MB:.0f} MiB in parts ({times:.1f}x a 16 MiB limit)"
    rate, base = len(archive) / min(split) / 1e6, len(archive) / min(one) / 1e6
    entries = [
        entry("load", what, rate, "MB/s", "one request (512 MiB limit)", base),
        entry("load", "seconds, in parts", min(split), "s"),
        entry("load", "seconds, one request", min(one), "s"),
    ]
    print_entries(entries)
    write_json(args.json, "load", entries, archive_bytes=len(archive), part_bytes=PART)
    return 0


if __name__ == "__main__":
    sys.exit(main())
