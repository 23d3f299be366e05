"""ferry.torch.enable_async_tp(): torch.compile fuses all_gather -> mm and mm -> reduce_scatter
into torch.ops.ferry's fused ops, with the right results, on 2 gloo ranks (CPU, no GPU needed;
torch_async_tp_ranks.py)."""

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ferry._ferry")


def test_compiled_tensor_parallel_matmuls_run_ferrys_fused_ops():
    import torch_async_tp_ranks
    from rank_processes import run_ranks

    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        got, _ = run_ranks(torch_async_tp_ranks.run_rank, 2, lambda r: (init, r, 2), method="spawn", timeout=600)
    errors = [e for _, errs in sorted(got) for e in errs]
    assert not errors, "\n".join(errors[:30])
