"""ferry.torch.symm, symmetric memory under torch.distributed._symmetric_memory's names: the names
port (CPU), bad calls are clear errors (CPU), and where there is a GPU the ranks (one per GPU, or
sharing a lone one) check peer views, put/wait ordering, barriers on two channels from two streams,
capture, the memory pool and the errors against seeded data (torch_symm_ranks.py)."""

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ferry._ferry")


def test_code_ports_by_changing_the_import():
    import torch.distributed._symmetric_memory as theirs

    import ferry.torch.symm as ours

    for name in ours.__all__:
        if name != "SymmetricMemory":
            assert hasattr(theirs, name), f"torch.distributed._symmetric_memory has no {name}"
    for name in ("rank", "world_size", "buffer_ptrs", "signal_pad_ptrs", "buffer_ptrs_dev", "signal_pad_ptrs_dev",
                 "buffer_size", "signal_pad_size", "get_buffer", "get_signal_pad", "barrier", "put_signal",
                 "wait_signal", "multicast_ptr", "has_multicast_support"):
        assert hasattr(theirs._SymmetricMemory, name), name
        assert hasattr(ours.SymmetricMemory, name) or name in ours.SymmetricMemory.__init__.__code__.co_names, name
    assert ours.get_signal_pad_size() == 2048 and not ours.is_nvshmem_available()


def test_a_host_tensor_is_a_clear_error(tmp_path):
    import torch.distributed as dist

    import ferry.torch.symm as symm

    with pytest.raises(ValueError, match="CUDA device memory, not cpu"):
        symm.empty(4, device="cpu")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"rank 0: .* not in symmetric memory: allocate it with ferry.torch.symm.empty"):
            symm.rendezvous(torch.empty(4))
    finally:
        dist.destroy_process_group()


def _gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_gpus() == 0 and not os.environ.get("FERRY_REQUIRE_GPU"), reason="no GPU")
def test_symmetric_memory_on_every_gpu(monkeypatch):
    import torch_symm_ranks
    from rank_processes import run_ranks

    monkeypatch.setenv("FERRY_SOCKET_IFNAME", "lo")
    n = max(2, _gpus())
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        got, _ = run_ranks(torch_symm_ranks.run_rank, n, lambda r: (init, r, n), method="spawn", timeout=240)
    errors = [e for _, errs in sorted(got) for e in errs]
    assert not errors, "\n".join(errors[:30])
