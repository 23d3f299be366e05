"""The torch.distributed backend "ferry" (ferry.torch). Without a GPU: it registers, and a group
that asks for it on a machine without CUDA is refused with a message saying so. With GPUs: a rank per
GPU (2 sharing a lone GPU) run every op of torch_backend_ranks.py, checked element by
element; on 2 GPUs, a group whose ranks say they are on two hosts runs on NCCL. Skips without torch or without the backend built, unless FERRY_REQUIRE_GPU=1 or
FERRY_REQUIRE_TORCH_BACKEND=1 (scripts/test.sh sets it where it installed torch)."""

import os
import tempfile

import pytest

import ferry

torch = pytest.importorskip("torch") if os.environ.get("FERRY_REQUIRE_GPU") != "1" else __import__("torch")


def _backend_built():
    if not ferry.native_available():
        return False
    try:
        from ferry import _torch  # noqa: F401
    except ImportError:
        return False
    return True


if not _backend_built():
    if os.environ.get("FERRY_REQUIRE_GPU") == "1" or os.environ.get("FERRY_REQUIRE_TORCH_BACKEND") == "1":
        raise RuntimeError("FERRY_REQUIRE_GPU or FERRY_REQUIRE_TORCH_BACKEND is 1, but ferry._torch (the torch "
                           "backend) is not built")
    pytest.skip("ferry._torch is not built (no torch at build time)", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

import ferry.torch  # noqa: E402,F401


def test_the_backend_is_registered_for_cuda():
    assert "ferry" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["ferry"] == ["cuda"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_a_group_on_ferry_is_refused_saying_why(tmp_path):
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        dist.init_process_group("cpu:gloo,cuda:ferry", init_method=f"file://{tmp_path}/init", rank=0, world_size=1)


def test_register_tensor_says_what_it_needs():
    """Before init_process_group; then (in a process of its own, so that this one stays
    uninitialized) a CPU tensor, and a group whose backend for it is gloo."""
    import subprocess
    import sys

    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            ferry.torch.register_tensor(torch.ones(2))
    code = """
import torch, torch.distributed as dist, ferry.torch as ft
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    ft.register_tensor(torch.ones(2))
except ValueError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "rank 0: a cpu tensor: only CUDA tensors go to the ferry backend" in out.stdout, out.stdout + out.stderr


def test_a_group_across_hosts_is_handed_to_nccl_or_refused(monkeypatch, caplog):
    """_forwarded, what the backend's factory does with a group ferry cannot hold, with
    ProcessGroupNCCL replaced by a recorder (no GPU here)."""
    import datetime
    import types

    made = []

    class FakeNccl:
        Options = types.SimpleNamespace

        def __init__(self, store, rank, size, options):
            made.append((store, rank, size, options._timeout))

    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeNccl, raising=False)
    options = types.SimpleNamespace(store="the store", group_rank=0, group_size=4,
                                    timeout=datetime.timedelta(seconds=7))
    with caplog.at_level("WARNING", logger="ferry"):
        backend = ferry.torch._forwarded(options, "rank 0: Comm needs every rank on one host")
    assert isinstance(backend, FakeNccl)
    assert made == [("the store", 0, 4, datetime.timedelta(seconds=7))]
    assert "the group of 4 ranks runs on NCCL: rank 0: Comm needs every rank on one host" in caplog.text
    monkeypatch.setenv("FERRY_TORCH_FORWARD", "0")
    with pytest.raises(RuntimeError, match="cannot run this group: rank 0: Comm needs every rank on one host"):
        ferry.torch._forwarded(options, "rank 0: Comm needs every rank on one host")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_every_op_on_every_gpu():
    import torch_backend_ranks
    from rank_processes import run_ranks

    os.environ.setdefault("FERRY_SOCKET_IFNAME", "lo")
    os.environ.setdefault("FERRY_DEVICE_TIMEOUT", "20")
    n = max(2, torch.cuda.device_count())  # a rank per GPU; 2 sharing a lone GPU
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        got, _ = run_ranks(torch_backend_ranks.run_rank, n, lambda r: (init, r, n), method="spawn", timeout=240)
        got = dict(got)
    errors = [e for r in sorted(got) for e in got[r]]
    assert not errors, "\n".join(errors[:30])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_ranks_that_disagree_get_an_error_not_a_hang(monkeypatch):
    import torch_backend_ranks
    from rank_processes import run_ranks

    monkeypatch.setenv("FERRY_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("FERRY_DEVICE_TIMEOUT", "10")  # the bound on a GPU-side wait
    n = max(2, torch.cuda.device_count())
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        # run_ranks raises TimeoutError (and kills them) if a rank reports nothing: a hang fails here.
        got, _ = run_ranks(torch_backend_ranks.mismatch_rank, n, lambda r: (init, r, n), method="spawn", timeout=180)
    quiet = [r for r, outcome in got if outcome == "no error"]
    assert not quiet, f"ranks {quiet} got no error from an all_reduce whose counts differ across ranks: {got}"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="NCCL needs a GPU per rank: 2 GPUs")
def test_a_group_across_hosts_runs_on_nccl(monkeypatch):
    import torch_backend_ranks
    from rank_processes import run_ranks

    monkeypatch.setenv("FERRY_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        got, _ = run_ranks(torch_backend_ranks.several_hosts_rank, 2, lambda r: (init, r, 2), method="spawn",
                           timeout=180)
    for rank, (backend, errors) in sorted(got):
        assert not errors, "\n".join(errors)
        assert backend == "ProcessGroupNCCL", f"rank {rank}: the group ran on {backend}"
