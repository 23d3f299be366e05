"""python -m ferry.torch.bench without GPUs. run_gpu_ranks, the spawn-and-collect helper of the
torch benchmarks: every rank's rows come back by rank; when a rank fails, its failure is printed,
then where each rank still running stands (its Python stack), and the call returns None at once.
The table: the slowest rank's times and NCCL-over-ferry ratios."""

import time

import pytest

pytest.importorskip("torch")

from ferry.torch.bench import run_gpu_ranks, table  # noqa: E402

import bench_ranks  # noqa: E402


def test_every_rank_s_rows_come_back_by_rank():
    assert run_gpu_ranks(bench_ranks.both_report, 3, ("rows",), timeout=120) == {
        0: ["rows 0"], 1: ["rows 1"], 2: ["rows 2"]}


def test_a_failed_rank_is_printed_with_where_the_others_stand(capfd):
    start = time.monotonic()
    assert run_gpu_ranks(bench_ranks.one_fails_one_hangs, 2, (), timeout=120) is None
    assert time.monotonic() - start < 30  # not the 60 s rank 0 would sleep
    err = capfd.readouterr().err
    assert "rank 1 failed:\nTraceback: rank 1 broke" in err
    assert "--- where rank 0 stands:" in err
    assert "stuck_in_a_collective" in err  # rank 0's stack, from faulthandler


def test_the_table_takes_the_slowest_rank_and_divides_nccl_by_ferry():
    def row(scale, ok=True):
        return {"bytes": 1024, "ferry_ok": ok, "nccl_ok": True, "ferry_eager": 10.0 * scale, "nccl_eager": 20.0,
                "registered_eager": 5.0 * scale, "ferry_graph": 4.0, "nccl_graph": 6.0, "ferry_host": 3.0,
                "nccl_host": 2.0}

    lines, bad = table([1024], {0: [row(1)], 1: [row(2)]}, 2, "GPU")
    cells = lines[3].split()
    assert not bad and "2 ranks" in lines[0] and "GPU" in lines[0]
    assert cells == ["1024", "20.00", "20.00", "1.00", "10.00", "2.00", "4.00", "6.00", "1.50", "3.00", "2.00", "ok"]
    lines, bad = table([1024], {0: [row(1)], 1: [row(1, ok=False)]}, 2, "GPU")
    assert bad and lines[3].endswith("WRONG")
