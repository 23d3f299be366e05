"""Per-group scratch tensors registered with the group's ferry backend (ferry.torch.register_tensor),
for the fused ops' composition (fused_ops.py): its collectives then run zero-copy on them instead of
staging through the Comm's scratch (docs/fused.md).

A workspace is kept per (group, slot) and grown, never shrunk. Growing is collective: every rank of
the group makes the same call with the same size, so every rank grows at the same call and the
registrations stay in step (register_tensor's contract). Opt-in while it is measured:
FERRY_FUSED_REGISTERED=1.
"""

from __future__ import annotations

import os
import threading

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

_lock = threading.Lock()
_workspaces = {}  # (group name, slot) -> (uint8 tensor, Registration)
_on_ferry = {}  # (group name, device index) -> whether the group's backend for that device is ferry's


def enabled() -> bool:
    return os.environ.get("FERRY_FUSED_REGISTERED") == "1"


def applies(t: torch.Tensor, group_name: str) -> bool:
    """Whether calls with t on the group take registered workspaces: opted in, a real CUDA tensor
    (not a fake one that torch.compile traces with), and the group's backend for it is ferry's."""
    if not (enabled() and t.is_cuda and not isinstance(t, torch._subclasses.FakeTensor)):
        return False
    key = (group_name, t.device.index)
    found = _on_ferry.get(key)
    if found is None:
        from ferry import torch as ferry_torch

        backend = c10d._resolve_process_group(group_name)._get_backend(t.device)
        found = _on_ferry[key] = ferry_torch._torch is not None and isinstance(backend, ferry_torch._torch.FerryBackend)
    return found


def get(group_name: str, slot: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """At least nbytes of the group's registered workspace `slot`, as uint8 (its first nbytes)."""
    from ferry import torch as ferry_torch

    key = (group_name, slot)
    with _lock:
        found = _workspaces.get(key)
        if found is None or found[0].numel() < nbytes:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"ferry fused ops: rank {dist.get_rank()}: the registered workspace of group {group_name!r} must "
                    f"grow to {nbytes} bytes, which registers memory with the other ranks: not while a CUDA graph "
                    f"is being captured (run the op once with the largest shape before the capture)")
            if found is not None:
                found[1].deregister()
            t = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)
            found = _workspaces[key] = (t, ferry_torch.register_tensor(t, c10d._resolve_process_group(group_name)))
        return found[0][:nbytes]
