"""ferry.torch.bench.run_gpu_ranks, the spawn-and-collect helper of the torch benchmarks, without
GPUs: every rank's rows come back by rank; when a rank fails, its failure is printed, then where
each rank still running stands (its Python stack), and the call returns None at once."""

import time

import pytest

pytest.importorskip("torch")

from ferry.torch.bench import run_gpu_ranks  # noqa: E402

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
