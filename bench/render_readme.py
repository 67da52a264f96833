"""Write the README's benchmark tables from the benchmarks' JSON (figures are never typed).

    python bench/durability_bench.py && python bench/render_readme.py

Each table sits between ``<!-- NAME -->`` and ``<!-- /NAME -->`` in README.md
and is rendered from one file in ``bench/results/`` (see ``TABLES``); a
missing file leaves its table as it is. A README without a table's markers is
an error, and then nothing is written.
"""

from __future__ import annotations

import argparse
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


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return ""
    return f"{v:,.2f} {unit}" if v < 100 else f"{v:,.0f} {unit}"


def _goal(e: dict) -> str:
    if e["goal"] is None:
        return ""
    if str(e["baseline"]).startswith("goal: "):
        want = f"{e['baseline'][6:]} {_value(e['baseline_value'], e['unit'])}"
    else:
        want = f"≥ {e['goal']:g}x"
    return f"{want} " + ("✓" if e["pass"] else "✗ not met")


def _caption(data: dict) -> str:
    m = data.get("machine") or {}
    load = m.get("loadavg") or m.get("loadavg_start")
    rounds = f"{data['rounds']} interleaved rounds of {data['seconds']:g} s per case, medians"
    quick = " (a quick run: noisy)" if data.get("quick") else ""
    return (
        f"`{data['command']}`{quick}: {rounds}; {m.get('cores', '?')} cores ({m.get('cpu', '?')}), "
        f"load average {load[0]:.1f} at the start; torch {m.get('torch')}, tensordict "
        f"{m.get('tensordict')}, torchrl {m.get('torchrl')}."
        if load
        else f"`{data['command']}`{quick}: {rounds}."
    )


def entries_table(source: str) -> str:
    """Any benchmark's entries, one row each (``bench/common.py``)."""
    data = json.loads((RESULTS / source).read_text())
    lines = [
        "| workload | value | against | its value | ratio | goal |",
        "|---|---|---|---|---|---|",
    ]
    for e in data["entries"]:
        ratio = "" if e["ratio"] is None else f"{e['ratio']:.2f}x"
        against = "" if str(e["baseline"]).startswith("goal: ") else e["baseline"] or ""
        base = "" if not against else _value(e["baseline_value"], e["unit"])
        lines.append(
            f"| {e['workload']} | {_value(e['value'], e['unit'])} | {against} | {base} | "
            f"{'' if not against else ratio} | {_goal(e)} |"
        )
    if "rounds" in data:
        lines += ["", _caption(data)]
    else:
        lines += [
            "",
            f"`{data['command']}`" + (" (a quick run: noisy)" if data.get("quick") else ""),
        ]
    return "\n".join(lines)


def http() -> str:
    """The HTTP client path (``bench/http_bench.py --json bench/results/http.json``)."""
    return entries_table("http.json")


def client() -> str:
    """HTTP client libraries (``bench/client_bench.py --json bench/results/client.json``)."""
    return entries_table("client.json")


def peers() -> str:
    """tdreplay / Reverb (``bench/peers_bench.py --json bench/results/peers.json``).

    One row per workload, a column per tdreplay transport.
    """
    data = json.loads((RESULTS / "peers.json").read_text())
    rows: dict[str, dict] = {}
    transports: list[str] = []
    for e in data["entries"]:
        workload, _, tr = e["workload"].rpartition(" (")
        tr = tr.rstrip(")")
        if tr not in transports:
            transports.append(tr)
        rows.setdefault(workload, {"reverb": e})[tr] = e
    head = " | ".join(f"tdreplay {tr}" for tr in transports)
    ratios = " | ".join(f"{tr} / Reverb" for tr in transports)
    lines = [
        f"| workload | {head} | Reverb (its best way) | {ratios} | goal |",
        "|---|" + "---|" * (2 * len(transports) + 2),
    ]
    for workload, by in rows.items():
        r = by["reverb"]
        vals = " | ".join(
            _value(by[tr]["value"], "items/s") if tr in by else "" for tr in transports
        )
        rats = " | ".join(
            (
                f"{by[tr]['ratio']:.2f}x"
                + ("" if by[tr]["pass"] is None else (" ✓" if by[tr]["pass"] else " ✗"))
            )
            if tr in by
            else ""
            for tr in transports
        )
        goal = "" if r["goal"] is None else f"≥ {r['goal']:g}x"
        lines.append(
            f"| {workload} | {vals} | {_value(r['baseline_value'], 'items/s')} "
            f"({r['baseline']}) | {rats} | {goal} |"
        )
    rv = (data.get("machine") or {}).get("reverb") or {}
    versions = ", ".join(f"{k} {v}" for k, v in rv.items() if v)
    lines += ["", _caption(data) + (f" Reverb side: {versions}." if versions else "")]
    return "\n".join(lines)


def shm() -> str:
    """The same-host transport (``bench/shm_bench.py --json bench/results/shm.json``)."""
    return entries_table("shm.json")


def scale() -> str:
    """S servers, K collectors, L learners on one host (``bench/scale_bench.py --json bench/results/scale.json``).

    One row per configuration; ratios are S servers / 1 server with the same K, L and transport.
    """
    data = json.loads((RESULTS / "scale.json").read_text())
    lines = [
        "| servers S | collectors K | learners L | transport | insert items/s | sample items/s "
        "| insert / 1 server | sample / 1 server | servers' CPU s/s (each) | collectors' CPU s/s "
        "| learners' CPU s/s | items per server CPU-second |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in data["configs"]:
        one = c["servers"] == 1
        each = " + ".join(f"{x:.2f}" for x in c["server_cpu_each"])
        ins = "baseline" if one else f"{c['insert_ratio']:.2f}x"
        smp = "baseline" if one else f"{c['sample_ratio']:.2f}x"
        cpu = f"{c['server_cpu']:.2f}" + ("" if one else f" ({each})")
        lines.append(
            f"| {c['servers']} | {c['collectors']} | {c['learners']} | {c['transport']} "
            f"| {c['insert']:,.0f} | {c['sample']:,.0f} | {ins} | {smp} | {cpu} "
            f"| {c['collector_cpu']:.2f} | {c['learner_cpu']:.2f} "
            f"| {c['items_per_server_cpu_s']:,.0f} |"
        )
    lines += [
        "",
        _caption(data).replace("per case", "per configuration")
        + f" {data['table']}: extends of {data['chunk']} rows, samples of {data['batch']}; "
        "every server, collector and learner a process of its own on these cores.",
    ]
    return "\n".join(lines)


def adapter() -> str:
    """The TorchRL adapter's own cost (``bench/adapter_bench.py --json bench/results/adapter.json``)."""
    return entries_table("adapter.json")


def writer() -> str:
    """The collector's writer (``bench/writer_bench.py --json bench/results/writer.json``)."""
    return entries_table("writer.json")


def gpu() -> str:
    """The loader's CUDA path (``bench/gpu_check.py --json bench/results/gpu.json``): its
    throughput, then the learner's time in ``next()`` and the checks, way by way."""
    data = json.loads((RESULTS / "gpu.json").read_text())
    checks = data["checks"]
    lines = [
        entries_table("gpu.json"),
        "",
        "| way | bit-identical to a CPU loader | learner's `next()`, median (p90) "
        "| a CPU loader's `next()` | one blocking copy of the batch |",
        "|---|---|---|---|---|",
    ]
    for name, c in checks.items():
        if not name.startswith("never blocks "):
            continue
        way = name.removeprefix("never blocks ")
        same = "yes" if checks.get(f"identical {way}", {}).get("pass") else "NO"
        lines.append(
            f"| {way} | {same} | {c['next_median_ms']:.2f} ms ({c['next_p90_ms']:.2f} ms) | "
            f"{c['next_without_copy_median_ms']:.2f} ms | {c['blocking_copy_ms']:.2f} ms |"
        )
    m = data.get("machine") or {}
    writer = checks.get("writer", {})
    lines += [
        "",
        f"On one {data.get('gpu') or data.get('device')} ({m.get('cores', '?')} cores; torch "
        f"{m.get('torch')}, tensordict {m.get('tensordict')}): "
        + ("every check passed" if data.get("ok") else "a check FAILED")
        + f"; a writer fed from CUDA tensors stored the CPU extends' bytes, "
        f"{writer.get('rows', 0):,} rows: {'yes' if writer.get('pass') else 'NO'}.",
    ]
    return "\n".join(lines)


def refactor(source: str = "core-reshape.json", how: str = "HTTP client") -> str:
    """Before/after a change (``bench/compare_trees.py --json bench/results/<source>``)."""
    data = json.loads((RESULTS / source).read_text())
    lines = [
        f"| workload ({how}, shipped schemas, memmap) | before items/s | after items/s | after/before |",
        "|---|---|---|---|",
    ]
    for r in data["results"]:
        lines.append(
            f"| {r['workload']} | {r['before']:,.0f} | {r['after']:,.0f} | {r['ratio']:.2f} |"
        )
    lines.append("")
    lines.append(f"`{data['command']}`: {data['rounds']} interleaved rounds, medians.")
    return "\n".join(lines)


def torchrl() -> str:
    """TorchRL drop-in (``examples/dqn/throughput.py --json examples/dqn/throughput.json``)."""
    data = json.loads((REPO / "examples" / "dqn" / "throughput.json").read_text())
    lines = [
        "| learner workload (2 collector processes writing) | TDReplayBuffer | TorchRL in-process | ratio |",
        "|---|---|---|---|",
    ]
    for e in data:
        lines.append(
            f"| {e['workload']} | {e['value']:,.0f} {e['unit']} | "
            f"{e['baseline_value']:,.0f} {e['unit']} | {e['ratio']:.2f}x |"
        )
    return "\n".join(lines)


def footprint() -> str:
    """Disk, memory, stop and reopen (``bench/footprint_bench.py --json bench/results/footprint.json``)."""
    return entries_table("footprint.json")


def export() -> str:
    """Exports over HTTP, held in memory vs streamed (``bench/export_bench.py --json bench/results/export.json``)."""
    return entries_table("export.json")


TABLES = {
    "durability-table": (durability, "durability.json"),
    "export-table": (export, "export.json"),
    "export-10gb-table": (lambda: entries_table("export-10gb.json"), "export-10gb.json"),
    "footprint-table": (footprint, "footprint.json"),
    "shm-table": (shm, "shm.json"),
    "core-reshape-table": (refactor, "core-reshape.json"),
    "http-table": (http, "http.json"),
    "peers-table": (peers, "peers.json"),
    "client-table": (client, "client.json"),
    "scale-table": (scale, "scale.json"),
    "writer-table": (writer, "writer.json"),
    "adapter-table": (adapter, "adapter.json"),
    "gpu-table": (gpu, "gpu.json"),
    "session-http-table": (
        lambda: refactor("session-http.json", "HTTP client"),
        "session-http.json",
    ),
    "session-shm-table": (
        lambda: refactor("session-shm.json", "shared-memory client"),
        "session-shm.json",
    ),
    "torchrl-table": (torchrl, "../../examples/dqn/throughput.json"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog=f"The tables: {', '.join(TABLES)}.",
    )
    parser.add_argument(
        "--readme",
        type=Path,
        default=REPO / "README.md",
        help="the file whose tables to rewrite (default: the repository's README.md)",
    )
    args = parser.parse_args(argv)
    if not args.readme.is_file():
        parser.error(f"--readme {args.readme}: no such file")
    return args


def main(argv: list[str] | None = None) -> int:
    readme = parse_args(argv).readme
    text = readme.read_text()
    for name, (render, source) in TABLES.items():
        if not (RESULTS / source).exists():
            print(f"skipped {name}: run the benchmark that writes bench/results/{source}")
            continue
        pattern = re.compile(rf"(<!-- {name} -->\n).*?(<!-- /{name} -->)", re.S)
        if not pattern.search(text):
            print(f"{readme} has no <!-- {name} --> markers: nothing written", file=sys.stderr)
            return 1
        body = render()
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
        print(f"rendered {name} from bench/results/{source}")
    readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
