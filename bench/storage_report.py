"""The storage benchmark's report: its tables on stdout, its goals, its common entries.

:mod:`storage_bench` measures; this module turns its rows into the printed tables, the
PASS/FAIL goals and the entries every benchmark writes (``bench/common.py``).
"""

from __future__ import annotations

from typing import Any

from common import bound_entry, entry

#: the throughput goals (bench/README.md), ratios to TorchRL at batch 256
CARTPOLE_MIN_RATIO = 0.9  # cartpole: at most 10% over TorchRL's cost
ATARI_MIN_RATIO = 3.0  # atari sample: >= 3x TorchRL


def fmt_rate(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def print_throughput(rows: list[dict]) -> list[dict]:
    print(
        f"\n{'workload':<32} {'impl':<12} {'items/s':>9} {'MB/s':>9} {'us/call':>9} "
        f"{'faults/call':>11} {'vs torchrl':>10}"
    )
    for r in rows:
        name = f"{r['env']} {r['backend']} {r['op']} b{r['batch']}"
        print(
            f"{name:<32} {r['impl']:<12} {fmt_rate(r['items_per_s']):>9} {r['mb_per_s']:>9.1f} "
            f"{r['s_per_call'] * 1e6:>9.1f} {r['page_faults_per_call']:>11.0f} "
            f"{r['ratio_vs_torchrl']:>9.2f}x"
        )
    goals = []
    for r in rows:
        if r["batch"] != 256 or r["impl"] != "ours":
            continue
        if r["env"] == "cartpole":
            goals.append(
                {
                    "goal": f"cartpole {r['backend']} {r['op']} b256 >= {CARTPOLE_MIN_RATIO}x torchrl",
                    "value": r["ratio_vs_torchrl"],
                    "pass": r["ratio_vs_torchrl"] >= CARTPOLE_MIN_RATIO,
                }
            )
        elif r["op"] == "sample":
            goals.append(
                {
                    "goal": f"atari {r['backend']} sample b256 >= {ATARI_MIN_RATIO}x torchrl",
                    "value": r["ratio_vs_torchrl"],
                    "pass": r["ratio_vs_torchrl"] >= ATARI_MIN_RATIO,
                }
            )
    return goals


def print_latency(results: list[dict]) -> list[dict]:
    small, large = results[0]["sizes"]
    print(
        f"\nsample latency, batch {results[0]['batch']}, cartpole items (the shipped 11 fields) on memmap "
        "(1M atari items would need ~56 GB).\n"
        "total: the whole table.sample(n) call. own: the same calls less the time spent in the\n"
        "row copy (the backend's gather, timed inside each call): sampler, bookkeeping,\n"
        "allocation, nesting. The copy itself is random reads of N rows and slows down as the\n"
        "table outgrows the CPU caches and TLB, in any buffer (see TorchRL's growth).\n"
    )
    print(
        f"{'sampler':<20} {'total@' + str(small):>12} {'total@' + str(large):>12} {'growth':>7} "
        f"{'own@' + str(small):>11} {'own@' + str(large):>11} {'growth':>7} {'limit':>6}  "
        f"{'torchrl total':>22}"
    )
    goals = []
    for r in results:
        s, own = r["s_per_call"], r["own_s_per_call"]
        trl = "n/a"
        if "torchrl_growth" in r:
            a, b = s[f"torchrl@{small}"] * 1e6, s[f"torchrl@{large}"] * 1e6
            trl = f"{a:.0f}->{b:.0f}us {r['torchrl_growth']:.2f}x"
        print(
            f"{r['sampler']:<20} {s[f'ours@{small}'] * 1e6:>10.1f}us {s[f'ours@{large}'] * 1e6:>10.1f}us "
            f"{r['growth']:>6.2f}x {own[f'ours@{small}'] * 1e6:>9.1f}us {own[f'ours@{large}'] * 1e6:>9.1f}us "
            f"{r['own_growth']:>6.2f}x {r['limit']:>5.2f}x  {trl:>22}"
        )
        goals.append(
            {
                "goal": f"{r['sampler']} sample cost at {large:,} / at {small:,} items "
                f"<= {r['limit']:.2f}x (own; total {r['growth']:.2f}x)",
                "value": r["own_growth"],
                "pass": r["pass"],
            }
        )
    return goals


def entries(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The common entries (``bench/common.py``): ours / TorchRL per workload, growth bounds."""
    out = []
    rows = results.get("throughput", [])
    base = {
        (r["env"], r["backend"], r["op"], r["batch"]): r for r in rows if r["impl"] == "torchrl"
    }
    for r in rows:
        if r["impl"] == "torchrl":
            continue
        key = (r["env"], r["backend"], r["op"], r["batch"])
        goal = None
        if r["batch"] == 256 and r["impl"] == "ours":
            if r["env"] == "cartpole":
                goal = CARTPOLE_MIN_RATIO
            elif r["op"] == "sample":
                goal = ATARI_MIN_RATIO
        impl = "" if r["impl"] == "ours" else f" {r['impl']}"
        out.append(
            entry(
                "storage",
                f"{r['env']} {r['backend']} {r['op']} b{r['batch']}{impl}",
                r["items_per_s"],
                "items/s",
                "torchrl",
                base[key]["items_per_s"],
                ratio=r["ratio_vs_torchrl"],
                goal=goal,
            )
        )
    for r in results.get("latency", []):
        small, large = r["sizes"]
        out.append(
            bound_entry(
                "storage",
                f"{r['sampler']} sample cost (own) at {large:,} / at {small:,} items",
                r["own_growth"],
                "x",
                r["limit"],
                most=True,
            )
        )
    return out
