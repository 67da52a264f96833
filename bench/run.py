"""Run every ``bench/*_bench.py``, one after another, each in its own process.

    python bench/run.py                  # all benchmarks, full runs
    python bench/run.py --quick          # all, short runs (--quick is passed on)
    python bench/run.py --quick storage  # only those whose name contains "storage"

Each benchmark prints its own figures, ratios and PASS/FAIL lines. The exit
status is 1 when a benchmark exited non-zero (crashed, or failed under its
own ``--strict``), 0 otherwise.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short runs (passed to every benchmark)")
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
    for bench in benches:
        cmd = [sys.executable, str(bench), *(["--quick"] if args.quick else [])]
        print(f"\n===== {bench.name} =====", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        print(
            f"===== {bench.name}: exit {rc} after {time.perf_counter() - t0:.0f}s =====", flush=True
        )
        if rc != 0:
            failed.append(bench.name)
    if failed:
        print(f"\nexited non-zero: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
