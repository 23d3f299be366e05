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
_workspaces = {}  # (group name, slot) -> (uint8 tensor, Registration, the backend it is registered with)


def enabled() -> bool:
    return os.environ.get("FERRY_FUSED_REGISTERED") == "1"


def _ferry_backend(group_name: str, device: torch.device):
    """The group's backend for device if it is ferry's, else None. Asked on every call: a group name
    may come back after destroy_process_group, on another backend."""
    from ferry import torch as ferry_torch

    backend = c10d._resolve_process_group(group_name)._get_backend(device)
    ferry_class = ferry_torch._torch.FerryBackend if ferry_torch._torch is not None else None
    return backend if ferry_class is not None and isinstance(backend, ferry_class) else None


def is_ferry_group(group_name: str, device: torch.device) -> bool:
    """Whether the group's backend for tensors on device is ferry's."""
    return _ferry_backend(group_name, device) is not None


def applies(t: torch.Tensor, group_name: str) -> bool:
    """Whether calls with t on the group take registered workspaces: opted in, a real CUDA tensor
    (not a fake one that torch.compile traces with), and the group's backend for it is ferry's."""
    if not (enabled() and t.is_cuda and not isinstance(t, torch._subclasses.FakeTensor)):
        return False
    return _ferry_backend(group_name, t.device) is not None


def holds(t: torch.Tensor) -> bool:
    """Whether t lies in one of the workspaces (which a later call overwrites): a compare of storages,
    no backend lookup."""
    base = t.untyped_storage().data_ptr()
    with _lock:
        return any(ws.untyped_storage().data_ptr() == base for ws, _, _ in _workspaces.values())


def get(group_name: str, slot: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """At least nbytes of the group's registered workspace `slot`, as uint8 (its first nbytes)."""
    from ferry import torch as ferry_torch

    key = (group_name, slot)
    backend = _ferry_backend(group_name, device)
    with _lock:
        found = _workspaces.get(key)
        if found is not None and found[2] is not backend:
            # A group of this name made again: the old registration went with its backend.
            _workspaces.pop(key)
            found = None
        if found is None or found[0].numel() < nbytes:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"ferry fused ops: rank {dist.get_rank()}: the registered workspace of group {group_name!r} must "
                    f"grow to {nbytes} bytes, which registers memory with the other ranks: not while a CUDA graph "
                    f"is being captured (run the op once with the largest shape before the capture)")
            if found is not None:
                found[1].deregister()
            t = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)
            registration = ferry_torch.register_tensor(t, c10d._resolve_process_group(group_name))
            found = _workspaces[key] = (t, registration, backend)
        return found[0][:nbytes]
