"""scripts/bench-compare.py: the before/after table of scripts/bench-before-after.sh, with NCCL's own
after/before ratio as the control and the host time per eager call."""
import json
from pathlib import Path

from script_loader import load_script


def write(path: Path, ferry_us: float, nccl_us: float, host_us: float | None) -> None:
    def m(us, host=None):
        return {"time_us": us, "host_us": host, "algbw": 1.0, "busbw": 1.0, "wrong": 0}
    rows = [{"collective": "allreduce", "bytes": 1024, "count": 512, "type": "bf16", "op": "sum", "root": -1,
             "algorithm": "allreduce_ll", "out_of_place": m(ferry_us, host_us), "in_place": m(ferry_us),
             "nccl": m(nccl_us, host_us and 2 * host_us)}]
    path.write_text(json.dumps({"tool": "ferry-bench", "rows": rows}))


def test_ratios_control_and_host_time(tmp_path, capsys):
    compare = load_script("bench-compare.py")
    write(tmp_path / "before_allreduce.json", 5.0, 6.0, None)
    write(tmp_path / "after_allreduce.json", 5.5, 6.6, 3.0)
    write(tmp_path / "after_allgather.json", 1.0, 1.0, 1.0)  # no before: left out
    assert compare.main([str(tmp_path), "--worst", "1"]) == 0
    out = capsys.readouterr().out
    assert "| allreduce | 1024 | 5.00 | 5.50 | 1.100 | 5.00 | 5.50 | 1.100 | 6.60 | 1.100 | 3.00 | 6.00 |" in out
    assert "allgather" not in out
    assert "worst: allreduce 1024 B" in out
