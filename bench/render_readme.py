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


def _value(v: float, unit: str) -> str:
    return f"{v:,.2f} {unit}" if v < 100 else f"{v:,.0f} {unit}"


def shm() -> str:
    """The same-host transport (``bench/shm_bench.py --json bench/results/shm.json``)."""
    data = json.loads((RESULTS / "shm.json").read_text())
    lines = [
        "| workload | value | against | its value | ratio | goal |",
        "|---|---|---|---|---|---|",
    ]
    for e in data["entries"]:
        goal = (
            "" if e["goal"] is None else f"≥ {e['goal']:g}x " + ("✓" if e["pass"] else "✗ not met")
        )
        ratio = "" if e["ratio"] is None else f"{e['ratio']:.2f}x"
        lines.append(
            f"| {e['workload']} | {_value(e['value'], e['unit'])} | {e['baseline']} | "
            f"{_value(e['baseline_value'], e['unit'])} | {ratio} | {goal} |"
        )
    m = data["machine"]
    lines.append("")
    lines.append(
        f"`{data['command']}`: {data['rounds']} interleaved rounds, medians; "
        f"{m.get('cores', '?')} cores shared by server and clients."
    )
    return "\n".join(lines)


def refactor() -> str:
    """Before/after a refactor (``bench/compare_trees.py --json bench/results/core-reshape.json``)."""
    data = json.loads((RESULTS / "core-reshape.json").read_text())
    lines = [
        "| workload (HTTP client, shipped schemas, memmap) | before items/s | after items/s | after/before |",
        "|---|---|---|---|",
    ]
    for r in data["results"]:
        lines.append(
            f"| {r['workload']} | {r['before']:,.0f} | {r['after']:,.0f} | {r['ratio']:.2f} |"
        )
    lines.append("")
    lines.append(f"`{data['command']}`: {data['rounds']} interleaved rounds, medians.")
    return "\n".join(lines)


TABLES = {
    "durability-table": (durability, "durability.json"),
    "shm-table": (shm, "shm.json"),
    "core-reshape-table": (refactor, "core-reshape.json"),
}


def main() -> int:
    readme = REPO / "README.md"
    text = readme.read_text()
    for name, (render, source) in TABLES.items():
        if not (RESULTS / source).exists():
            print(f"skipped {name}: run the benchmark that writes bench/results/{source}")
            continue
        pattern = re.compile(rf"(<!-- {name} -->\n).*?(<!-- /{name} -->)", re.S)
        if not pattern.search(text):
            print(f"README.md has no <!-- {name} --> markers", file=sys.stderr)
            return 1
        body = render()
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
        print(f"rendered {name} from bench/results/{source}")
    readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
