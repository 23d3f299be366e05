#!/usr/bin/env python3
"""Draws ferry-bench results (the --json file) as PNGs: for every collective, type and op, time
and bus bandwidth against message size, ferry (out of place and in place) beside NCCL from the
same run.

    scripts/plot-bench.py results.json -o plots/            # one PNG per collective/type/op
    scripts/plot-bench.py 4gpus.json 2gpus.json -o plots/   # several runs (world sizes) at once

Needs matplotlib (scripts/install-deps.sh installs it). Prints the path of every PNG it writes.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def human_bytes(n: float) -> str:
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:g}{unit}"
        n /= 1024
    return f"{n:g}G"


def series(rows: list[dict], key: str, field: str) -> tuple[list[int], list[float]]:
    """(bytes, values) of one measurement ('out_of_place', 'in_place', 'nccl') where it exists."""
    xs, ys = [], []
    for row in rows:
        m = row.get(key)
        if m:
            xs.append(row["bytes"])
            ys.append(m[field])
    return xs, ys


def plot_group(plt, title: str, rows: list[dict], path: Path) -> None:
    rows = sorted(rows, key=lambda r: r["bytes"])
    fig, (lat, bw) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = (("out_of_place", "ferry", "-o"), ("in_place", "ferry in place", "--s"), ("nccl", "NCCL", "-^"))
    for key, label, style in styles:
        xs, ys = series(rows, key, "time_us")
        if xs:
            lat.plot(xs, ys, style, label=label, markersize=4)
        xs, ys = series(rows, key, "busbw")
        if xs:
            bw.plot(xs, ys, style, label=label, markersize=4)
    for ax, ylabel in ((lat, "time (µs, lower is better)"), (bw, "bus bandwidth (GB/s, higher is better)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ticks = sorted({r["bytes"] for r in rows})
        step = max(1, len(ticks) // 8)
        ax.set_xticks(ticks[::step])
        ax.set_xticklabels([human_bytes(t) for t in ticks[::step]])
        ax.legend()
    lat.set_yscale("log")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="ferry-bench --json files")
    parser.add_argument("-o", "--out", type=Path, default=Path("."), help="folder for the PNGs")
    args = parser.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot-bench.py: matplotlib is missing (scripts/install-deps.sh installs it)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    written = 0
    for result in args.results:
        try:
            doc = json.loads(result.read_text())
            world = doc["world_size"]
            groups: dict[tuple, list[dict]] = defaultdict(list)
            for row in doc["rows"]:
                groups[(row["collective"], row["type"], row["op"])].append(row)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"plot-bench.py: {result}: not a ferry-bench JSON file ({e})", file=sys.stderr)
            return 1
        nccl = doc.get("nccl_version") or "not loaded"
        for (collective, dtype, op), rows in sorted(groups.items()):
            name = f"{collective}_{dtype}_{op}_{world}gpus.png"
            title = f"{collective} {dtype} {op}, {world} GPUs (ferry {doc.get('version', '?')}, NCCL {nccl})"
            plot_group(plt, title, rows, args.out / name)
            print(args.out / name)
            written += 1
    if written == 0:
        print("plot-bench.py: no rows to plot", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
