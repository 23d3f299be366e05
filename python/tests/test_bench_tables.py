"""scripts/bench-tables.py turns ferry-bench JSON files into the report tables: ferry beside NCCL, a
plan beside its native algorithm, ferry through the NCCL API beside native ferry and NCCL."""
import json
from pathlib import Path

from script_loader import load_script


def measure(us):
    return {"time_us": us, "host_us": us / 10, "algbw": 1.0, "busbw": 2.0, "wrong": 0}


def bench_file(path: Path, algorithm: str, ferry_us: float, nccl_us: float | None, registered=False) -> Path:
    rows = [{"collective": "allreduce", "bytes": 1 << s, "count": 1 << (s - 1), "type": "bf16", "op": "sum",
             "root": -1, "algorithm": algorithm, "out_of_place": measure(ferry_us + s),
             "in_place": None, "nccl": None if nccl_us is None else measure(nccl_us + s)} for s in (10, 20)]
    path.write_text(json.dumps({"tool": "ferry-bench", "version": "0.1.0", "world_size": 4, "graph": True,
                                "registered": registered, "rows": rows}))
    return path


def test_summary_has_ferry_nccl_and_their_ratio(tmp_path, capsys):
    tables = load_script("bench-tables.py")
    assert tables.main(["summary", str(bench_file(tmp_path / "b.json", "allreduce_ll", 0.0, 10.0))]) == 0
    out = capsys.readouterr().out
    assert "### allreduce bf16 sum, 4 ranks, unregistered buffers, CUDA graphs" in out
    # A file from before --nccl-variants: its "nccl" was NCCL on plain buffers.
    assert "| 1 KiB | 10.00 | 2.0 | 20.00 | - | - | 2.0 | 2.00 | 1.00 | 2.00 | allreduce_ll |" in out
    assert "| 1 MiB | 20.00 |" in out


def test_a_title_says_when_ferry_summed_in_float32(tmp_path, capsys):
    tables = load_script("bench-tables.py")
    path = bench_file(tmp_path / "b.json", "allreduce_ll", 0.0, 10.0)
    doc = json.loads(path.read_text())
    doc["accumulation"] = "float32"  # ferry-bench --accumulate float32
    path.write_text(json.dumps(doc))
    assert tables.main(["summary", str(path)]) == 0
    assert "### allreduce bf16 sum (ferry: float32 sums), 4 ranks" in capsys.readouterr().out


def test_summary_shows_every_nccl_variant_and_the_ratio_to_the_fastest(tmp_path, capsys):
    tables = load_script("bench-tables.py")
    path = bench_file(tmp_path / "b.json", "allreduce_ll", 0.0, 10.0)
    doc = json.loads(path.read_text())
    for row in doc["rows"]:
        row["nccl_variants"] = {"plain": measure(40.0), "registered": None, "window": row["nccl"]}
        row["nccl_variant"] = "window"
    path.write_text(json.dumps(doc))
    assert tables.main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| NCCL plain (us) | NCCL registered | NCCL window | best NCCL busbw | best NCCL / ferry |" in out
    assert "| 1 KiB | 10.00 | 2.0 | 40.00 | - | 20.00 | 2.0 | 2.00 | 1.00 | 2.00 | allreduce_ll |" in out


def test_pair_divides_plan_by_native(tmp_path, capsys):
    tables = load_script("bench-tables.py")
    plan = bench_file(tmp_path / "p.json", "plan:allreduce_two_shot", 10.0, None, registered=True)
    native = bench_file(tmp_path / "n.json", "allreduce_direct", 0.0, None, registered=True)
    assert tables.main(["pair", str(plan), str(native)]) == 0
    out = capsys.readouterr().out
    assert "| size | plan:allreduce_two_shot (us) | allreduce_direct (us) | plan / native |" in out
    assert "| 1 KiB | 20.00 | 10.00 | 2.00 |" in out


def test_api_puts_the_three_side_by_side(tmp_path, capsys):
    tables = load_script("bench-tables.py")
    through_api = bench_file(tmp_path / "a.json", "allreduce_ll", 0.0, 1.0)  # "nccl" = ferry via the API
    real = bench_file(tmp_path / "b.json", "allreduce_ll", 0.0, 20.0)
    assert tables.main(["api", str(through_api), str(real)]) == 0
    assert "| 1 KiB | 11.00 | 10.00 | 1.10 | 30.00 |" in capsys.readouterr().out


def test_compare_puts_runs_beside_the_fastest_nccl_of_them_all(tmp_path, capsys):
    tables = load_script("bench-tables.py")
    before = bench_file(tmp_path / "b.json", "allreduce_ll", 10.0, 30.0)
    after = bench_file(tmp_path / "a.json", "allreduce_ll", 0.0, 8.0)
    doc = json.loads(after.read_text())
    doc["rows"][0]["nccl_variants"] = {"plain": measure(50.0), "registered": None, "window": measure(15.0)}
    doc["rows"][1]["out_of_place"]["wrong"] = 3
    after.write_text(json.dumps(doc))
    assert tables.main(["compare", f"before={before}", f"after={after}"]) == 0
    out = capsys.readouterr().out
    assert "| size | before (us) | after (us) | best NCCL (us) | NCCL / before | NCCL / after | wrong |" in out
    # 1 KiB: ferry 20 and 10; NCCL 40 (before), 15 (after's window): the fastest is 15.
    assert "| 1 KiB | 20.00 | 10.00 | 15.00 | 0.75 | 1.50 | 0 |" in out
    assert "| 1 MiB | 30.00 | 20.00 | 28.00 | 0.93 | 1.40 | 3 |" in out
    assert tables.main(["compare", str(before)]) == 2
    assert "give each run as NAME=FILE" in capsys.readouterr().err


def test_not_a_bench_file_is_an_error(tmp_path, capsys):
    tables = load_script("bench-tables.py")
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 3}')
    assert tables.main(["summary", str(bad)]) == 2
    assert "not a ferry-bench --json file" in capsys.readouterr().err
