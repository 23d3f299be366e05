#!/usr/bin/env python3
"""Markdown tables from ferry-bench --json files, for reports: ferry beside NCCL, a plan beside the
native algorithm of the same shape, and ferry through the NCCL API beside native ferry and NCCL.

    scripts/bench-tables.py summary bench.json                # per collective: ferry, NCCL on each kind of
                                                              # buffers, the ratio to the fastest NCCL, and
                                                              # the host time of one eager call of each
    scripts/bench-tables.py pair plan.json native.json        # plan time / native time per size
    scripts/bench-tables.py api api.json bench.json           # NCCL API (api.json's "nccl" column,
                                                              # measured with --nccl libferry_nccl.so),
                                                              # native ferry, real NCCL (bench.json)
    scripts/bench-tables.py compare before=b.json after=a.json   # several runs of one call (builds,
                                                              # settings) beside the fastest NCCL of
                                                              # them all, and the wrong results

Times are the out-of-place medians in microseconds; a size missing from a file shows as "-".
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} GiB"


def load(path: Path) -> dict:
    doc = json.loads(path.read_text())
    if doc.get("tool") != "ferry-bench" or not isinstance(doc.get("rows"), list):
        raise ValueError(f"{path}: not a ferry-bench --json file")
    return doc


def groups(doc: dict) -> dict[tuple, dict[int, dict]]:
    """(collective, type, op) -> bytes -> row."""
    out: dict[tuple, dict[int, dict]] = {}
    for row in doc["rows"]:
        out.setdefault((row["collective"], row["type"], row["op"]), {})[row["bytes"]] = row
    return out


def time_of(row: dict | None, key: str) -> float | None:
    m = row.get(key) if row else None
    return m["time_us"] if m else None


def host_of(row: dict | None, key: str) -> float | None:
    m = row.get(key) if row else None
    return m.get("host_us") if m else None


def cell(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def title(doc: dict, key: tuple) -> str:
    coll, dtype, op = key
    reduces = coll in ("allreduce", "reducescatter", "reduce")
    what = f"{coll} {dtype}" + (f" {op}" if reduces else "")
    how = "registered" if doc.get("registered") else "unregistered"
    if reduces and doc.get("accumulation") == "float32":
        what += " (ferry: float32 sums)"
    return f"{what}, {doc['world_size']} ranks, {how} buffers, {'CUDA graphs' if doc.get('graph') else 'launches'}"


VARIANTS = ("plain", "registered", "window")


def variant_time(row: dict, variant: str) -> float | None:
    """NCCL's time on one kind of buffers (ferry-bench --nccl-variants); a file from before the
    variants has only "nccl", which was the plain one."""
    variants = row.get("nccl_variants")
    if variants is None:
        return time_of(row, "nccl") if variant == "plain" else None
    m = variants.get(variant)
    return m["time_us"] if m else None


def summary(doc: dict) -> str:
    parts = []
    for key, rows in groups(doc).items():
        lines = [f"### {title(doc, key)}", "",
                 "| size | ferry (us) | busbw (GB/s) | NCCL plain (us) | NCCL registered | NCCL window | "
                 "best NCCL busbw | best NCCL / ferry | host (us) | NCCL host (us) | algorithm |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for size in sorted(rows):
            r = rows[size]
            ferry, nccl = r.get("out_of_place"), r.get("nccl")
            times = " | ".join(cell(variant_time(r, v)) for v in VARIANTS)
            lines.append(f"| {human_bytes(size)} | {cell(time_of(r, 'out_of_place'))} | "
                         f"{cell(ferry['busbw'] if ferry else None, '{:.1f}')} | {times} | "
                         f"{cell(nccl['busbw'] if nccl else None, '{:.1f}')} | "
                         f"{ratio(time_of(r, 'nccl'), time_of(r, 'out_of_place'))} | "
                         f"{cell(host_of(r, 'out_of_place'))} | {cell(host_of(r, 'nccl'))} | {r.get('algorithm', '')} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def pair(plan: dict, native: dict) -> str:
    p, n = groups(plan), groups(native)
    parts = []
    for key in p:
        rows_p, rows_n = p[key], n.get(key, {})
        name_p = next(iter(rows_p.values())).get("algorithm", "plan")
        name_n = next(iter(rows_n.values())).get("algorithm", "native") if rows_n else "native"
        lines = [f"### {title(plan, key)}", "",
                 f"| size | {name_p} (us) | {name_n} (us) | plan / native |", "| --- | --- | --- | --- |"]
        for size in sorted(set(rows_p) | set(rows_n)):
            a, b = time_of(rows_p.get(size), "out_of_place"), time_of(rows_n.get(size), "out_of_place")
            lines.append(f"| {human_bytes(size)} | {cell(a)} | {cell(b)} | {ratio(a, b)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def api(through_api: dict, bench: dict) -> str:
    a, b = groups(through_api), groups(bench)
    parts = []
    for key, rows in a.items():
        lines = [f"### {title(through_api, key)}", "",
                 "| size | ferry via NCCL API (us) | native ferry (us) | API / native | real NCCL (us) |",
                 "| --- | --- | --- | --- | --- |"]
        real = b.get(key, {})
        for size in sorted(rows):
            via, native = time_of(rows[size], "nccl"), time_of(rows[size], "out_of_place")
            lines.append(f"| {human_bytes(size)} | {cell(via)} | {cell(native)} | {ratio(via, native)} | "
                         f"{cell(time_of(real.get(size), 'nccl'))} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def wrong_of(row: dict) -> int:
    """Wrong elements of every measurement in a row: ferry's and each NCCL variant's."""
    measures = [row.get("out_of_place"), row.get("in_place"), row.get("nccl")]
    measures += list((row.get("nccl_variants") or {}).values())
    return sum(m.get("wrong", 0) for m in measures if m)


def best_nccl(rows: list[dict]) -> float | None:
    """The fastest NCCL time of any variant in any of the rows."""
    times = [variant_time(r, v) for r in rows for v in VARIANTS] + [time_of(r, "nccl") for r in rows]
    times = [t for t in times if t is not None]
    return min(times) if times else None


def compare(runs: list[tuple[str, dict]]) -> str:
    """One table per collective: each named run's ferry time, the fastest NCCL of every run, the
    ratio of that NCCL to each run (above 1: ferry is faster) and the wrong results of all runs."""
    names = [n for n, _ in runs]
    grouped = [groups(doc) for _, doc in runs]
    parts = []
    for key in grouped[0]:
        lines = [f"### {title(runs[0][1], key)}", "",
                 "| size | " + " | ".join(f"{n} (us)" for n in names) + " | best NCCL (us) | " +
                 " | ".join(f"NCCL / {n}" for n in names) + " | wrong |",
                 "| --- |" + " --- |" * (2 * len(names) + 2)]
        sizes = sorted(set().union(*(g.get(key, {}).keys() for g in grouped)))
        for size in sizes:
            rows = [g.get(key, {}).get(size) for g in grouped]
            present = [r for r in rows if r]
            nccl = best_nccl(present)
            times = [time_of(r, "out_of_place") for r in rows]
            lines.append(f"| {human_bytes(size)} | " + " | ".join(cell(t) for t in times) + f" | {cell(nccl)} | " +
                         " | ".join(ratio(nccl, t) for t in times) + f" | {sum(wrong_of(r) for r in present)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("summary").add_argument("bench", type=Path)
    p = sub.add_parser("pair")
    p.add_argument("plan", type=Path)
    p.add_argument("native", type=Path)
    p = sub.add_parser("api")
    p.add_argument("through_api", type=Path)
    p.add_argument("bench", type=Path)
    p = sub.add_parser("compare")
    p.add_argument("runs", nargs="+", metavar="NAME=FILE")
    args = parser.parse_args(argv)
    try:
        if args.what == "summary":
            print(summary(load(args.bench)), end="")
        elif args.what == "pair":
            print(pair(load(args.plan), load(args.native)), end="")
        elif args.what == "compare":
            runs = []
            for item in args.runs:
                name, sep, path = item.partition("=")
                if not sep or not name or not path:
                    raise ValueError(f"'{item}': give each run as NAME=FILE")
                runs.append((name, load(Path(path))))
            print(compare(runs), end="")
        else:
            print(api(load(args.through_api), load(args.bench)), end="")
    except (OSError, ValueError, KeyError) as e:
        print(f"bench-tables.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
