"""ferry.Comm on torch tensors, on the GPU: every collective x every dtype x every op, sizes 0, 1,
odd, 4 KiB and (float32, bfloat16) 1 MiB and 64 MiB, in and out of place, a user stream, PreMulSum,
refusals, CuPy arrays (where CuPy is installed), registered buffers, and a DSL plan added at run
time. Ranks are spawned processes
(sharing the GPUs when there are fewer GPUs than ranks). gpu_comm_ranks.py is what a rank runs.

Skips without torch or a GPU, unless FERRY_REQUIRE_GPU=1 (as the GPU check sets).
"""

import os

import pytest

import ferry


def _gpu_ready():
    if not ferry.native_available():
        return "ferry._ferry is not built"
    try:
        import torch
    except ImportError:
        return "no torch"
    if not torch.cuda.is_available():
        return "no GPU"
    return None


_why = _gpu_ready()
if _why is not None:
    if os.environ.get("FERRY_REQUIRE_GPU") == "1":
        raise RuntimeError(f"FERRY_REQUIRE_GPU=1 but {_why}")
    pytest.skip(_why, allow_module_level=True)

import gpu_comm_ranks  # noqa: E402
from rank_processes import run_ranks  # noqa: E402


def _run(n, plan_checks):
    os.environ.setdefault("FERRY_SOCKET_IFNAME", "lo")
    os.environ.setdefault("FERRY_DEVICE_TIMEOUT", "20")  # a collective that hangs fails in 20 s
    uid = ferry.UniqueId.create()
    got, codes = run_ranks(gpu_comm_ranks.run_rank, n, lambda r: (uid, r, n, plan_checks), method="spawn", timeout=240)
    got = dict(got)
    errors = [e for r in sorted(got) for e in got[r]]
    assert not errors, "\n".join(errors[:40])
    assert codes == [0] * n


@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_dtype_and_op_on_torch_tensors(n):
    _run(n, plan_checks=(n == 2))
