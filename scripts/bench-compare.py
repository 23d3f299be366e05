#!/usr/bin/env python3
"""The before/after table of scripts/bench-before-after.sh: for every collective and size, ferry's
out-of-place time before and after, their ratio, in place the same, NCCL's time, and the host time
of one eager call (ferry after, NCCL) where the after run measured it. NCCL's own after/before ratio
is the control: NCCL is the same library in both runs, so where it moves too, the machine moved.

    scripts/bench-compare.py DIR            # DIR holds before_<coll>.json and after_<coll>.json
    scripts/bench-compare.py DIR --worst 5  # also the five largest after/before ratios

Rows missing on either side are left out; the exit status is 0.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def rows(path: Path) -> dict[tuple, dict]:
    doc = json.loads(path.read_text())
    return {(r["collective"], r["bytes"]): r for r in doc["rows"]}


def us(row: dict, key: str, field: str = "time_us") -> float | None:
    m = row.get(key)
    return None if not m else m.get(field)


def fmt(v: float | None, spec: str = "{:.2f}") -> str:
    return "-" if v is None else spec.format(v)


def table(folder: Path) -> tuple[str, list[tuple[float, str, int, str]]]:
    lines = ["| collective | bytes | before us | after us | after/before | in place before | in place after | "
             "in place after/before | NCCL us | NCCL after/before | host us (after) | NCCL host us |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    for after_path in sorted(folder.glob("after_*.json")):
        before_path = folder / after_path.name.replace("after_", "before_", 1)
        if not before_path.exists():
            continue
        before, after = rows(before_path), rows(after_path)
        for key in sorted(after, key=lambda k: (k[0], k[1])):
            if key not in before:
                continue
            b, a = before[key], after[key]
            cells = []
            for place in ("out_of_place", "in_place"):
                tb, ta = us(b, place), us(a, place)
                r = ta / tb if tb and ta else None
                if r is not None:
                    ratios.append((r, key[0], key[1], place))
                cells += [fmt(tb), fmt(ta), fmt(r, "{:.3f}")]
            nb, na = us(b, "nccl"), us(a, "nccl")
            control = fmt(na / nb if nb and na else None, "{:.3f}")
            lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + f" | {fmt(na)} | {control} | "
                         f"{fmt(us(a, 'out_of_place', 'host_us'))} | {fmt(us(a, 'nccl', 'host_us'))} |")
    return "\n".join(lines) + "\n", ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--worst", type=int, default=0)
    args = parser.parse_args(argv)
    text, ratios = table(args.folder)
    print(text, end="")
    if args.worst:
        print()
        for r, coll, size, place in sorted(ratios, reverse=True)[: args.worst]:
            print(f"worst: {coll} {size} B {place}: after/before {r:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
