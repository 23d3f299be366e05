"""Training on the ferry backend: a small seeded transformer trained for 200 steps with DDP and with
FSDP2 on a rank per GPU (2 sharing a lone GPU) follows, step by step, the loss curve of the same
model trained in one process on the whole batch; with 2 GPUs or more, also the curves of the NCCL
backend. The same training on PyTorch's NCCL backend with libferry_nccl.so preloaded (the NCCL API
on ferry) follows the one-process curve too. Needs a GPU and the backend (skips otherwise, unless
FERRY_REQUIRE_GPU=1)."""

import os
import pathlib
import tempfile

import pytest

import ferry

if os.environ.get("FERRY_REQUIRE_GPU") != "1":
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU", allow_module_level=True)
    try:
        from ferry import _torch  # noqa: F401
    except ImportError:
        pytest.skip("ferry._torch is not built", allow_module_level=True)
else:
    import torch

STEPS = 200
RANKS = max(2, torch.cuda.device_count())  # a rank per GPU; 2 sharing a lone GPU


def _curves(backend, n):
    import torch_training_ranks
    from rank_processes import run_ranks

    os.environ.setdefault("FERRY_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as d:
        got, _ = run_ranks(torch_training_ranks.run_rank, n, lambda r: (os.path.join(d, "init"), r, n, backend, STEPS),
                           method="spawn", timeout=360)
    errors = [f"rank {r}: {e}" for r, _, e in got if e]
    assert not errors, "\n".join(errors)
    return {r: c for r, c, _ in got}


def _assert_follows(got, want, what, rtol):
    assert len(got) == len(want) == STEPS, what
    for step, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= rtol * abs(w) + 1e-6, f"{what}: step {step}: loss {g}, want {w}"


def test_ddp_and_fsdp2_on_ferry_follow_one_process():
    curves = _curves("ferry", RANKS)
    single = curves[0]["single"]
    assert single[-1] < single[0] * 0.9, f"the reference did not learn: {single[0]} -> {single[-1]}"
    for rank in curves:
        for kind in ("ddp", "fsdp2"):
            _assert_follows(curves[rank][kind], single, f"rank {rank} {kind} vs one process", 2e-3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
def test_ddp_and_fsdp2_on_ferry_follow_nccl():
    ferry_curves, nccl_curves = _curves("ferry", RANKS), _curves("nccl", RANKS)
    for kind in ("ddp", "fsdp2"):
        _assert_follows(ferry_curves[0][kind], nccl_curves[0][kind], f"{kind}: ferry vs nccl", 1e-3)


def _libferry_nccl():
    """libferry_nccl.so of the build that this ferry package belongs to (its shims/nccl), or None."""
    package = pathlib.Path(os.path.abspath(ferry.__file__)).parent  # <build>/python/ferry, links kept
    found = [p for p in (package.parents[1] / "shims" / "nccl" / "libferry_nccl.so", package / "libferry_nccl.so")
             if p.exists()]
    return found[0] if found else None


def test_ddp_and_fsdp2_on_nccl_with_libferry_nccl_preloaded_follow_one_process(monkeypatch):
    lib = _libferry_nccl()
    if lib is None:
        pytest.skip("libferry_nccl.so is not built beside this package (the build tree's shims/nccl)")
    monkeypatch.setenv("LD_PRELOAD", str(lib))  # the ranks are new processes: PyTorch's NCCL calls reach ferry
    curves = _curves("nccl", RANKS)
    assert all(curves[r]["libferry_nccl"] for r in curves), "a rank ran without libferry_nccl.so mapped"
    single = curves[0]["single"]
    for rank in curves:
        for kind in ("ddp", "fsdp2"):
            _assert_follows(curves[rank][kind], single, f"rank {rank} {kind} (NCCL backend, ferry preloaded) vs one "
                            "process", 2e-3)
