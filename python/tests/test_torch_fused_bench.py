"""python -m ferry.torch.fused_bench without GPUs: the Llama 3 TP shapes it times, the table it
prints from the ranks' times (bound, TFLOP/s, the check), and that it says there is nothing to
measure where there are fewer than 2 GPUs."""

import pytest

pytest.importorskip("torch")

from ferry.torch import fused_bench  # noqa: E402


def test_the_llama_shapes_cut_for_tensor_parallelism():
    rows = fused_bench.shapes(["70b"], 4, [2048])
    assert rows == [
        ("70b", "qkv", "ag", 2048, 8192, (64 + 16) * 128 // 4, "bf16"),
        ("70b", "attn_out", "rs", 2048, 64 * 128 // 4, 8192, "bf16"),
        ("70b", "mlp_up_gate", "ag", 2048, 8192, 2 * 28672 // 4, "bf16"),
        ("70b", "mlp_down", "rs", 2048, 28672 // 4, 8192, "bf16"),
    ]
    both = fused_bench.shapes(["8b"], 2, [256], ("bf16", "fp8"))
    assert [r[-1] for r in both] == ["bf16"] * 4 + ["fp8"] * 4 and [r[:-1] for r in both[:4]] == [r[:-1] for r in both[4:]]


def test_the_table_takes_the_slowest_rank_and_the_larger_of_matmul_and_comm():
    rows = [("8b", "qkv", "ag", 1024, 4096, 3072, "fp8")]
    flops = 2.0 * 1024 * 4096 * 3072
    per_rank = {
        0: [{"wrong": [], "matmul": 100.0, "comm": 50.0, "comm_registered": 35.0, "nccl_comm": 45.0, "ferry": 110.0, "registered": 115.0, "pipelined": 130.0, "pipelined_sm": 125.0,
             "unfused": 150.0,
             "torch": None}],
        1: [{"wrong": [], "matmul": 120.0, "comm": 40.0, "comm_registered": 20.0, "nccl_comm": 30.0, "ferry": 100.0, "registered": 105.0, "pipelined": 90.0, "pipelined_sm": 95.0,
             "unfused": 140.0,
             "torch": None, "torch_error": "RuntimeError: no"}],
    }
    lines, bad = fused_bench.table(rows, per_rank, 2, "GPU")
    cells = lines[2].split()
    assert not bad
    assert cells[3] == "fp8"
    del cells[3]  # the dtype: the columns below count from the model as before it
    assert cells[6] == f"{flops / 120.0 / 1e6:.1f}"  # matmul: the slowest rank's 120 us
    # The collective alone in us: on ferry, on ferry with its tensors registered, on NCCL; no
    # all-to-all for an all-gather.
    assert cells[7:11] == ["50.0", "35.0", "45.0", "-"]
    assert cells[11] == cells[6]  # bound = max(matmul 120, comm 50)
    assert cells[12] == f"{flops / 110.0 / 1e6:.1f}"  # ferry: the slowest rank's 110 us
    assert cells[13] == f"{flops / 115.0 / 1e6:.1f}"  # registered 115
    assert cells[14] == f"{flops / 130.0 / 1e6:.1f}" and cells[17] == "-"  # pipelined 130; torch did not run
    assert cells[15] == f"{flops / 125.0 / 1e6:.1f}"  # pipelined by SM copies 125
    assert cells[18] == f"{120.0 / 110.0:.2f}"  # bound over the fastest form (ferry)
    assert cells[19] == f"{150.0 / 110.0:.2f}" and cells[20] == "ok"  # unfused's slowest 150 us over ferry's 110
    assert lines[-1] == "# torch's fused op did not run: RuntimeError: no"
    for r, t in ((0, 60.0), (1, 70.0)):  # a reduce-scatter's all-to-all: the slowest rank's
        per_rank[r][0]["a2a"] = t
    assert fused_bench.table(rows, per_rank, 2, "GPU")[0][2].split()[11] == "70.0"
    per_rank[1][0]["wrong"] = ["pipelined"]
    lines, bad = fused_bench.table(rows, per_rank, 2, "GPU")
    assert bad and lines[2].endswith("WRONG: pipelined")


def test_without_two_gpus_there_is_nothing_to_measure(capsys):
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("GPUs here: the benchmark would run")
    assert fused_bench.main(["-m", "256"]) == 0
    assert "nothing to measure" in capsys.readouterr().out
