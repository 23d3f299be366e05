"""ferry.torch.fused_ops: the tensor-parallel ops (torch.ops.ferry.fused_all_gather_matmul,
fused_matmul_reduce_scatter and their fp8 forms) with PyTorch's schemas, checked against the
product of every rank's seeded inputs: on 2 ranks of a gloo group (CPU, no GPU needed), and where
there are GPUs on CUDA tensors of the ferry backend, a rank per GPU."""

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


def _run(device, n):
    import torch_fused_ranks
    from rank_processes import run_ranks

    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        got, _ = run_ranks(torch_fused_ranks.run_rank, n, lambda r: (init, r, n, device), method="spawn", timeout=240)
    errors = [e for _, errs in sorted(got) for e in errs]
    assert not errors, "\n".join(errors[:30])


def test_every_op_gather_and_scatter_dim_on_two_ranks():
    _run("cpu", 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_every_op_on_the_ferry_backend_on_every_gpu(monkeypatch):
    monkeypatch.setenv("FERRY_SOCKET_IFNAME", "lo")
    _run("cuda", max(2, torch.cuda.device_count()))
