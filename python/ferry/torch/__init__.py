"""ferry as a torch.distributed backend. Importing this module registers the backend "ferry":

    import torch.distributed as dist
    import ferry.torch  # noqa: F401  (registers "ferry")
    dist.init_process_group("cpu:gloo,cuda:ferry")   # under torchrun
    dist.all_reduce(tensor)                          # on the ferry backend for CUDA tensors

The ranks of a group meet through the group's store: rank 0 makes a ferry.UniqueId (a fresh
random secret) and sets it there; every rank then joins ferry's bootstrap with it and makes the
group's ferry.Comm on the current CUDA device. The backend itself is C++ (ferry._torch, built
against the installed torch by `pip install .`); docs/pytorch.md says what it supports.
"""

import logging
import os

import torch
import torch.distributed as dist

from ferry import _ferry

try:
    from ferry import _torch
except ImportError as e:  # built without torch, or against another torch
    _torch = None
    _import_error = e
else:
    _import_error = None

BACKEND = "ferry"


def _unique_id_hex(store, rank):
    """Rank 0's fresh UniqueId, through the group's store (a PrefixStore of the group's name)."""
    key = "ferry/unique_id"
    if rank == 0:
        uid = _ferry.UniqueId.create()
        store.set(key, uid.hex())
        return uid.hex()
    return store.get(key).decode()


def _create_backend(options, _backend_options=None):
    """torch.distributed's backend factory (extended API): one ferry backend per process group."""
    if _torch is None:
        raise RuntimeError(
            "ferry's torch backend (ferry._torch) is not built: reinstall ferry (`pip install .`) in an "
            "environment where torch is importable"
        ) from _import_error
    if not torch.cuda.is_available():
        raise RuntimeError("ferry's torch backend needs a CUDA device; use gloo for CPU tensors ('cpu:gloo,cuda:ferry')")
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "ferry's torch backend: a process group cannot be made while a CUDA graph is being captured "
            "(it allocates and meets the other ranks): make it before the capture"
        )
    rank, size = options.group_rank, options.group_size
    timeout = options.timeout.total_seconds() if hasattr(options.timeout, "total_seconds") else float(options.timeout)
    uid = _unique_id_hex(options.store, rank)
    backend = _torch.FerryBackend(uid, rank, size, torch.cuda.current_device(), timeout)
    if backend._why_not_native:
        return _forwarded(options, backend._why_not_native)
    return backend


def _forwarded(options, why):
    """A group ferry cannot run (its ranks span hosts: docs/multi-node.md) goes whole to PyTorch's
    NCCL backend, saying why on rank 0, unless FERRY_TORCH_FORWARD=0 makes it an error. Every rank
    takes the same turn: the reason comes from the host layout, which all of them see alike."""
    if os.environ.get("FERRY_TORCH_FORWARD", "1") == "0":
        raise RuntimeError(f"ferry's torch backend cannot run this group: {why} (FERRY_TORCH_FORWARD=0 refuses to "
                           "hand it to NCCL)")
    if options.group_rank == 0:
        logging.getLogger("ferry").warning("ferry's torch backend: the group of %d ranks runs on NCCL: %s",
                                           options.group_size, why)
    nccl_options = dist.ProcessGroupNCCL.Options()
    nccl_options._timeout = options.timeout
    return dist.ProcessGroupNCCL(options.store, options.group_rank, options.group_size, nccl_options)


def _adapt_to_torch():
    """What torch's Python layer asks of a backend beyond c10d::Backend, for the ferry backend.

    - new_group, when the default group is bound to a device and its backend can split: ranks left
      out of the new group call perform_nocolor_split (ProcessGroupNCCL keeps its ncclCommSplit
      calls in step with it). ferry makes such a group through its store, not a split, so there is
      nothing to keep in step: a no-op. split_group is what splits ferry's bootstrap (every rank).
    - split_group (torch 2.11) deep-copies the parent backend's `options` (a property that torch's
      own backends define, and c10d::Backend's binding does not there), which pybind11 cannot copy:
      they come as a subclass that can.
    """
    if _torch is None:
        return
    from torch._C._distributed_c10d import Backend as _Backend

    class FerryOptions(_Backend.Options):
        def __deepcopy__(self, memo):
            return FerryOptions(BACKEND, self._timeout)

    _torch.FerryBackend.options = property(lambda self: FerryOptions(BACKEND, self._timeout))
    _torch.FerryBackend.perform_nocolor_split = lambda self, device: None


def _register():
    if BACKEND in dist.Backend.backend_list:
        return
    _adapt_to_torch()
    dist.Backend.register_backend(BACKEND, _create_backend, extended_api=True, devices=["cuda"])


_register()

# torch.ops.ferry.fused_all_gather_matmul and the other tensor-parallel ops (fused_ops.py).
from ferry.torch import fused_ops  # noqa: E402,F401


class Registration:
    """A tensor registered with a group's ferry backend (register_tensor). It keeps the tensor alive
    until deregister() (or the end of a `with` block), so that its memory is not handed out again
    while the group's Comm has it mapped."""

    def __init__(self, backend, rid, tensor):
        self._backend, self._id, self.tensor = backend, rid, tensor

    def deregister(self):
        """Local: waits for the group's queued work, then forgets the registration. Every rank
        deregisters before the next op that used the tensor."""
        if self._id is not None:
            rid, self._id = self._id, None
            self._backend._deregister_tensor(rid)
            self.tensor = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.deregister()


def register_tensor(tensor, group=None):
    """Registers `tensor`'s memory (its whole storage) with the ferry backend of `group` (default:
    the world), so that ops on the group whose tensors lie inside registrations on every rank run
    zero-copy: peers read and write them directly instead of staging through the Comm's scratch.
    Collective: every rank of the group registers its tensor of the same role, in the same order,
    outside CUDA graph capture (as NCCL's window registration). An op registered on some ranks but
    not on others fails with an error naming them. Returns a Registration (deregister(), or use it
    in a `with` block)."""
    if not dist.is_initialized():
        raise RuntimeError("ferry.torch.register_tensor: torch.distributed is not initialized (call "
                           "init_process_group first)")
    if group is None:
        group = dist.group.WORLD
    if not tensor.is_cuda:
        raise ValueError(f"ferry.torch.register_tensor: rank {dist.get_rank()}: a {tensor.device} tensor: only CUDA "
                         f"tensors go to the ferry backend")
    try:
        backend = group._get_backend(tensor.device)
    except RuntimeError as e:
        raise ValueError(f"ferry.torch.register_tensor: rank {dist.get_rank()}: the group has no backend for "
                         f"{tensor.device} ({e})") from e
    if _torch is None or not isinstance(backend, _torch.FerryBackend):
        raise ValueError(f"ferry.torch.register_tensor: rank {dist.get_rank()}: the group's backend for "
                         f"{tensor.device} is {type(backend).__name__}, not ferry's (make the group with "
                         f"'cpu:gloo,cuda:ferry')")
    return Registration(backend, backend._register_tensor(tensor), tensor)


def enable_async_tp(group=None):
    """torch.compile's async tensor parallelism with ferry's fused ops for `group` (default the
    world): see async_tp.py. Imported on first use, so that `import ferry.torch` stays light."""
    from ferry.torch.async_tp import enable_async_tp as enable

    return enable(group)
