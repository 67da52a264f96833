"""Write the README's benchmark tables from the benchmarks' JSON (figures are never typed).

    python bench/durability_bench.py && python bench/render_readme.py

Each table sits between ``<!-- NAME -->`` and ``<!-- /NAME -->`` in README.md.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def durability() -> str:
    data = json.loads((RESULTS / "durability.json").read_text())["workloads"]
    lines = [
        "| workload | state in RAM (before) | crash-durable (default) | ratio | `--fsync always` |",
        "|---|---|---|---|---|",
    ]
    for name, v in data.items():
        lines.append(
            f"| {name} | {v['volatile']:,.0f} | {v['durable']:,.0f} | "
            f"{v['durable_over_volatile']:.2f} | {v['fsync']:,.0f} |"
        )
    return "\n".join(lines)


TABLES = {"durability-table": (durability, "durability.json")}


def main() -> int:
    readme = REPO / "README.md"
    text = readme.read_text()
    for name, (render, source) in TABLES.items():
        if not (RESULTS / source).exists():
            print(f"skipped {name}: run the benchmark that writes bench/results/{source}")
            continue
        pattern = re.compile(rf"(<!-- {name} -->\n).*?(\n\s*<!-- /{name} -->)", re.S)
        if not pattern.search(text):
            print(f"README.md has no <!-- {name} --> markers", file=sys.stderr)
            return 1
        body = render()
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), text)
        print(f"rendered {name} from bench/results/{source}")
    readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
