"""ferry.Comm on torch tensors, on the GPU: every collective x every dtype x every op, sizes 0, 1,
odd, 4 KiB and (float32, bfloat16) 1 MiB and 64 MiB, in and out of place, a user stream, PreMulSum,
refusals, CuPy arrays (where CuPy is installed), registered buffers, and a DSL plan added at run
time. Ranks are spawned processes
(sharing the GPUs when there are fewer GPUs than ranks). gpu_comm_ranks.py is what a rank runs.

Skips without torch or a GPU, unless FERRY_REQUIRE_GPU=1 (as the GPU check sets).
"""

import multiprocessing
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


def _run(n, plan_checks):
    os.environ.setdefault("FERRY_SOCKET_IFNAME", "lo")
    os.environ.setdefault("FERRY_DEVICE_TIMEOUT", "20")  # a collective that hangs fails in 20 s
    uid = ferry.UniqueId.create()
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=gpu_comm_ranks.run_rank, args=(uid, r, n, plan_checks, results)) for r in range(n)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=600) for _ in range(n))
    for p in procs:
        p.join(timeout=60)
    errors = [e for r in sorted(got) for e in got[r]]
    assert not errors, "\n".join(errors[:40])
    assert all(p.exitcode == 0 for p in procs)


@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_dtype_and_op_on_torch_tensors(n):
    _run(n, plan_checks=(n == 2))
