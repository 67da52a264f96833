"""Run every ``bench/*_bench.py``, one after another, each in its own process.

    python bench/run.py                  # all benchmarks, full runs
    python bench/run.py --quick          # all, short runs (--quick is passed on)
    python bench/run.py --quick storage  # only those whose name contains "storage"
    python bench/run.py --quick --json out.json   # also collect every figure in one file

Each benchmark prints its own figures, ratios and PASS/FAIL lines. With
``--json FILE`` each is run with ``--json`` into a scratch file, and FILE
gets all their entries (``bench/common.py``: ``{bench, workload, value,
unit, baseline, baseline_value, ratio, goal, pass}``) with this machine's
info and each benchmark's exit status. The exit status is 1 when a
benchmark exited non-zero (crashed, or failed under its own ``--strict``),
0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import machine, print_entries

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short runs (passed to every benchmark)")
    p.add_argument("--json", type=Path, help="collect every benchmark's entries into this file")
    p.add_argument(
        "only", nargs="*", help="run the benchmarks whose file name contains one of these"
    )
    args = p.parse_args(argv)
    benches = sorted(HERE.glob("*_bench.py"))
    if args.only:
        benches = [b for b in benches if any(word in b.name for word in args.only)]
    if not benches:
        print("no benchmark matched", file=sys.stderr)
        return 1
    failed = []
    collected: dict[str, Any] = {"command": " ".join(["python", "bench/run.py", *sys.argv[1:]])}
    collected.update(quick=args.quick, machine=machine(), benches={}, entries=[])
    scratch = Path(tempfile.mkdtemp(prefix="tdreplay-bench-run-"))
    for bench in benches:
        out = scratch / f"{bench.stem}.json"
        cmd = [sys.executable, str(bench), *(["--quick"] if args.quick else [])]
        if args.json:
            cmd += ["--json", str(out)]
        print(f"\n===== {bench.name} =====", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        wall = time.perf_counter() - t0
        print(f"===== {bench.name}: exit {rc} after {wall:.0f}s =====", flush=True)
        if rc != 0:
            failed.append(bench.name)
        got = json.loads(out.read_text()) if out.exists() else {}
        collected["benches"][bench.stem] = {
            "exit": rc,
            "wall_s": wall,
            "entries": len(got.get("entries", [])),
            "skipped": not out.exists() and rc == 0,  # a benchmark that could not run here
        }
        collected["entries"] += got.get("entries", [])
    shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        collected["machine"]["loadavg_end"] = list(os.getloadavg())
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(collected, indent=2) + "\n")
        if collected["entries"]:
            print_entries(collected["entries"])
        print(f"wrote {args.json}: {len(collected['entries'])} entries")
    if failed:
        print(f"\nexited non-zero: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
