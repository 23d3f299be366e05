"""scripts/plot-bench.py draws a PNG per collective/type/op from a ferry-bench JSON file, and says
clearly when the file is not one."""
import json
from pathlib import Path

import pytest
from script_loader import load_script


def measure(us, nbytes, factor):
    return {"time_us": us, "algbw": nbytes / us / 1e3, "busbw": nbytes / us / 1e3 * factor, "wrong": 0}


def bench_json(path: Path) -> Path:
    rows = []
    for collective, factor in (("allreduce", 1.5), ("allgather", 0.75)):
        for shift in range(10, 21, 2):
            nbytes = 1 << shift
            rows.append({"collective": collective, "bytes": nbytes, "count": nbytes // 2, "type": "bf16",
                         "op": "sum", "root": 0, "algorithm": "x",
                         "out_of_place": measure(5 + shift, nbytes, factor),
                         "in_place": measure(5.5 + shift, nbytes, factor),
                         "nccl": None if shift == 20 else measure(8 + shift, nbytes, factor)})
    path.write_text(json.dumps({"tool": "ferry-bench", "version": "0.1.0", "world_size": 4, "rows": rows,
                                "nccl_version": "2.27.3"}))
    return path


def test_one_png_per_collective(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot = load_script("plot-bench.py")
    assert plot.main([str(bench_json(tmp_path / "r.json")), "-o", str(tmp_path / "png")]) == 0
    written = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert written == ["allgather_bf16_sum_4gpus.png", "allreduce_bf16_sum_4gpus.png"]
    for name in written:
        assert (tmp_path / "png" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "allreduce_bf16_sum_4gpus.png" in capsys.readouterr().out


def test_not_a_bench_file_is_an_error(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    plot = load_script("plot-bench.py")
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 3}')
    assert plot.main([str(bad), "-o", str(tmp_path)]) == 1
    assert "not a ferry-bench JSON file" in capsys.readouterr().err


def test_human_bytes():
    plot = load_script("plot-bench.py")
    assert [plot.human_bytes(n) for n in (512, 1024, 64 << 10, 1 << 30)] == ["512B", "1K", "64K", "1G"]
