"""ferry.torch.fused_ops: the tensor-parallel ops (torch.ops.ferry.fused_all_gather_matmul,
fused_matmul_reduce_scatter and their fp8 forms) with PyTorch's schemas, checked against the
product of every rank's seeded inputs: on 3 ranks of a gloo group (CPU, no GPU needed; the C++
kernels of the torch extension where it is built, else the Python bodies), and where there are GPUs
on CUDA tensors of the ferry backend, a rank per GPU."""

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ferry._ferry")


def test_the_ops_have_pytorchs_schemas():
    from ferry.torch import fused_ops  # noqa: F401
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*)

    for op in ("fused_all_gather_matmul", "fused_all_gather_scaled_matmul", "fused_matmul_reduce_scatter",
               "fused_scaled_matmul_reduce_scatter"):
        ours = getattr(torch.ops.ferry, op).default._schema
        theirs = getattr(torch.ops.symm_mem, op).default._schema
        assert str(ours).replace("ferry::", "") == str(theirs).replace("symm_mem::", ""), op


def test_the_ops_run_from_cpp_where_the_extension_is_built():
    from ferry.torch import fused_ops

    try:
        import ferry._torch  # noqa: F401
    except ImportError:
        if os.environ.get("FERRY_REQUIRE_TORCH_BACKEND") == "1":
            raise
        pytest.skip("ferry._torch is not built (no torch at build time)")
    assert fused_ops.NATIVE_KEYS == {name: ("CPU", "CUDA") for name in (
        "fused_all_gather_matmul", "fused_matmul_reduce_scatter", "fused_all_gather_scaled_matmul",
        "fused_scaled_matmul_reduce_scatter")}
    for name in ("_composed_all_gather_matmul", "_composed_matmul_reduce_scatter",
                 "_composed_all_gather_scaled_matmul", "_composed_scaled_matmul_reduce_scatter"):
        # What the C++ kernels hand back to Python: the same schema, the Python body for CPU and CUDA.
        for key in ("CPU", "CUDA"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"ferry::{name}", key), (name, key)
        public = str(getattr(torch.ops.ferry, "fused" + name[len("_composed"):]).default._schema)
        assert str(getattr(torch.ops.ferry, name).default._schema) == public.replace("::fused", "::_composed"), name


def test_the_size_table_pipelines_only_large_reduce_scatters(monkeypatch):
    from ferry.torch import fused_pipeline

    monkeypatch.setattr(fused_pipeline, "_applies", lambda t, dim, size: True)
    from ferry.torch import registered_workspace

    monkeypatch.setattr(registered_workspace, "is_ferry_group", lambda name, device: name == "ferry-group")
    big = torch.empty(8192, 7168, device="meta"), torch.empty(7168, 8192, device="meta")  # 9.6e11 flops
    small = torch.empty(1024, 3584, device="meta"), torch.empty(3584, 4096, device="meta")  # 3.0e10 flops
    for env, want_big, want_small, want_ag in (("", True, False, False), ("1", True, True, True),
                                               ("0", False, False, False)):
        monkeypatch.setenv("FERRY_FUSED_PIPELINE", env)
        assert fused_pipeline.chosen_for_reduce_scatter(*big, "sum", 0, 4, "ferry-group") is want_big, env
        assert fused_pipeline.chosen_for_reduce_scatter(*small, "avg", 0, 4, "ferry-group") is want_small, env
        assert fused_pipeline.chosen_for_all_gather(big[0], 0, 4, [big[1]], "ferry-group") is want_ag, env
        # Not what the pipelined form reduces, or rows it cannot split evenly: the composition.
        assert not fused_pipeline.chosen_for_reduce_scatter(*big, "max", 0, 4, "ferry-group")
        assert not fused_pipeline.chosen_for_reduce_scatter(*big, "sum", 0, 3, "ferry-group")
        # The size table stays on ferry's groups (symmetric memory needs the ranks on one host).
        assert fused_pipeline.chosen_for_reduce_scatter(*big, "sum", 0, 4, "nccl-group") is (env == "1"), env
    # An all-gather's threshold counts the gathered A's products with every B, on ferry's groups only.
    monkeypatch.setenv("FERRY_FUSED_PIPELINE", "")
    monkeypatch.setattr(fused_pipeline, "AG_AUTO_MIN_FLOPS", 1.5e12)
    shard = big[0][:2048]  # 4 ranks x 2048 rows x 7168 x 8192 x 2: 9.6e11 flops a B
    assert fused_pipeline.chosen_for_all_gather(shard, 0, 4, [big[1], big[1]], "ferry-group")
    assert not fused_pipeline.chosen_for_all_gather(shard, 0, 4, [big[1]], "ferry-group")
    assert not fused_pipeline.chosen_for_all_gather(shard, 0, 4, [big[1], big[1]], "nccl-group")


def _run(device, n):
    import torch_fused_ranks
    from rank_processes import run_ranks

    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        got, _ = run_ranks(torch_fused_ranks.run_rank, n, lambda r: (init, r, n, device), method="spawn", timeout=240)
    errors = [e for _, errs in sorted(got) for e in errs]
    assert not errors, "\n".join(errors[:30])


def test_every_op_gather_and_scatter_dim_on_three_ranks():
    # Three: the exact check of the float32 accumulation needs three ranks or more.
    _run("cpu", 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_every_op_on_the_ferry_backend_on_every_gpu(monkeypatch):
    monkeypatch.setenv("FERRY_SOCKET_IFNAME", "lo")
    _run("cuda", max(2, torch.cuda.device_count()))
