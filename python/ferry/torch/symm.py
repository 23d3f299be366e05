"""Symmetric memory for PyTorch, with the names of torch.distributed._symmetric_memory, so that code
ports by changing its import (docs/symmetric_memory.md):

    import ferry.torch.symm as symm_mem          # was: import torch.distributed._symmetric_memory as symm_mem
    t = symm_mem.empty(4096, dtype=torch.bfloat16, device="cuda")
    h = symm_mem.rendezvous(t, dist.group.WORLD)  # collective over the group
    peer = h.get_buffer((h.rank + 1) % h.world_size, (4096,), torch.bfloat16)
    peer.copy_(x)                                 # writes the next rank's t
    h.barrier(channel=0)                          # then every rank sees what was written to it

Each rank's buffer is ferry device memory that every rank of the group maps (ferry.SymmetricMemory);
the signal pads and their kernels (put_signal, wait_signal, barrier) run on the current stream and
can be captured into a CUDA graph. Allocation and rendezvous cannot: inside a capture they raise.
Every rank of the group must be on this host (ranks may share a GPU).
"""

import math
import threading

import torch
import torch.distributed as dist

from ferry import _ferry
from ferry.rendezvous import bootstrap_from_store

__all__ = [
    "empty",
    "rendezvous",
    "get_mem_pool",
    "get_symm_mem_workspace",
    "is_symm_mem_enabled_for_group",
    "enable_symm_mem_for_group",
    "get_signal_pad_size",
    "is_nvshmem_available",
    "SymmetricMemory",
]

_lock = threading.RLock()
_communicators = {}  # group name -> ferry Communicator of the group's ranks
_handles = {}  # (segment base, address, nbytes, group name) -> SymmetricMemory
_pools = {}  # device index -> torch.cuda.MemPool
_workspaces = {}  # group name -> (tensor, SymmetricMemory)


def _refuse_while_capturing(call):
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"ferry.torch.symm.{call}: not allowed while a CUDA graph is being captured (it allocates memory "
            f"or exchanges it with the other ranks); call it before the capture. Inside a capture use the "
            f"handle's get_buffer, barrier, put_signal and wait_signal")


def _cuda_device(device, call):
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"ferry.torch.symm.{call}: symmetric memory is CUDA device memory, not {dev}")
    return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)


def _group(group, call):
    if group is None:
        group = dist.group.WORLD
    if isinstance(group, str):
        group = dist.distributed_c10d._resolve_process_group(group)
    if group is None:
        raise RuntimeError(f"ferry.torch.symm.{call}: torch.distributed is not initialized "
                           f"(call init_process_group first)")
    return group


def _communicator(group):
    """One ferry Communicator per group, made collectively by its ranks at their first rendezvous;
    they meet through the default store, under a key of the group's own."""
    name = group.group_name
    with _lock:
        comm = _communicators.get(name)
        if comm is None:
            store = dist.distributed_c10d._get_default_store()
            boot = bootstrap_from_store(store, dist.get_rank(group), group.size(), prefix=f"ferry/symm/{name}")
            comm = _communicators[name] = _ferry.Communicator(boot)
        return comm


class _Segment:
    """Owns a segment from symmetric_alloc: the tensors of empty() keep it, and its end forgets the
    handles made on it (which then free it)."""

    def __init__(self, base, device_index):
        self.base = base
        self.device = device_index

    def __del__(self):
        with _lock:
            for key in [k for k in _handles if k[0] == self.base]:
                del _handles[key]
        # Kernels queued on the tensor may still run: this memory is freed without waiting for the
        # GPU, and torch's caching allocator, which waits for its own, does not own it.
        try:
            torch.cuda.synchronize(self.device)
        except Exception:  # noqa: BLE001  (at interpreter exit torch may be gone; the process ends anyway)
            pass
        _ferry.symmetric_free(self.base)


def _itemsize(dtype):
    return dtype.itemsize


def _tensor_at(address, sizes, dtype, device_index, owner):
    sizes = tuple(int(s) for s in sizes)
    raw = _ferry.device_bytes(address, math.prod(sizes) * _itemsize(dtype), device_index, owner)
    return raw.view(dtype).view(sizes)


def empty(*size, dtype=None, device=None):
    """An uninitialized tensor in symmetric memory of its own (torch.empty's arguments). Every rank
    of a group must allocate the same size before rendezvous."""
    _refuse_while_capturing("empty")
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        size = tuple(size[0])
    dtype = dtype or torch.get_default_dtype()
    dev = _cuda_device(device, "empty")
    nbytes = max(1, math.prod(size) * _itemsize(dtype))
    base = _ferry.symmetric_alloc(nbytes, dev.index)
    return _tensor_at(base, size, dtype, dev.index, _Segment(base, dev.index))


def get_mem_pool(device=None):
    """A torch.cuda.MemPool whose segments are symmetric memory: tensors allocated inside
    `torch.cuda.use_mem_pool(get_mem_pool(device))` can be rendezvoused (allocate them in the same
    order on every rank). The segments stay mapped while a handle made on them lives."""
    _refuse_while_capturing("get_mem_pool")
    dev = _cuda_device(device, "get_mem_pool")
    with _lock:
        pool = _pools.get(dev.index)
        if pool is None:
            allocator = torch.cuda.memory.CUDAPluggableAllocator(_ferry.__file__, "ferry_symmetric_alloc",
                                                                 "ferry_symmetric_free")
            pool = _pools[dev.index] = torch.cuda.MemPool(allocator.allocator())
        return pool


def rendezvous(tensor, group=None):
    """Collective over `group` (a ProcessGroup or its name; default: the world): every rank passes
    its own symmetric tensor of the same size; returns the handle that maps all of them. The same
    tensor and group again return the same handle."""
    _refuse_while_capturing("rendezvous")
    group = _group(group, "rendezvous")
    storage = tensor.untyped_storage()
    address, nbytes = storage.data_ptr(), storage.nbytes()
    segment = _ferry.symmetric_segment(address) if tensor.is_cuda else None
    if segment is None:
        raise ValueError(
            f"ferry.torch.symm.rendezvous: rank {dist.get_rank()}: the tensor ({tensor.device}, "
            f"{tuple(tensor.shape)}) is not in symmetric memory: allocate it with ferry.torch.symm.empty(...) "
            f"or inside torch.cuda.use_mem_pool(ferry.torch.symm.get_mem_pool(device))")
    key = (segment[0], address, nbytes, group.group_name)
    with _lock:
        handle = _handles.get(key)
        if handle is None:
            comm = _communicator(group)
            with torch.cuda.device(tensor.device):
                native = _ferry.SymmetricMemory.rendezvous(comm, address, nbytes)
            handle = _handles[key] = SymmetricMemory(native, tensor.device.index, group)
        return handle


def get_symm_mem_workspace(group, min_size):
    """A symmetric buffer of at least min_size bytes for the group, kept and grown (collectively:
    every rank asks for the same size) as PyTorch's workspace is."""
    group = _group(group, "get_symm_mem_workspace")
    with _lock:
        found = _workspaces.get(group.group_name)
        if found is None or found[1].buffer_size < min_size:
            # Only a workspace that must grow stops a capture: the one in place is captured as is.
            _refuse_while_capturing("get_symm_mem_workspace")
            t = empty(max(int(min_size), 1), dtype=torch.uint8, device=torch.device("cuda", torch.cuda.current_device()))
            found = _workspaces[group.group_name] = (t, rendezvous(t, group))
        return found[1]


def get_signal_pad_size():
    """The bytes of each rank's signal pad: 4 per rank and channel."""
    return _ferry.SymmetricMemory.default_signal_pad_size


def is_nvshmem_available():
    """ferry's symmetric memory does not use NVSHMEM."""
    return False


def is_symm_mem_enabled_for_group(group_name):
    """Every group can use symmetric memory here (no enabling step)."""
    return True


def enable_symm_mem_for_group(group_name):
    """Nothing to do: kept so that code written for torch's symmetric memory runs unchanged."""


class SymmetricMemory:
    """A rendezvous' handle: every rank's buffer and signal pad, mapped here."""

    def __init__(self, native, device_index, group):
        self._native = native
        self._device = device_index
        self.group_name = group.group_name
        self.rank = native.rank
        self.world_size = native.world_size
        self.buffer_size = native.buffer_size
        self.signal_pad_size = native.signal_pad_size
        self.buffer_ptrs = native.buffer_ptrs
        self.signal_pad_ptrs = native.signal_pad_ptrs
        self.buffer_ptrs_dev = native.buffer_ptrs_dev
        self.signal_pad_ptrs_dev = native.signal_pad_ptrs_dev
        # NVLink multicast is never used by ferry (docs/architecture.md, rule 1).
        self.multicast_ptr = 0

    def _view(self, call, ptrs, limit, rank, sizes, dtype, storage_offset):
        if not 0 <= rank < self.world_size:
            raise ValueError(f"ferry.torch.symm {call}: rank {self.rank}: rank {rank} is outside "
                             f"[0, {self.world_size})")
        item = _itemsize(dtype)
        start = int(storage_offset) * item
        end = start + math.prod(sizes) * item
        if storage_offset < 0 or end > limit:
            raise ValueError(f"ferry.torch.symm {call}: rank {self.rank}: {tuple(sizes)} {dtype} at element "
                             f"{storage_offset} ends at byte {end}, past the {limit} bytes of rank {rank}'s "
                             f"{'buffer' if call == 'get_buffer' else 'signal pad'}")
        return _tensor_at(ptrs[rank] + start, sizes, dtype, self._device, self)

    def get_buffer(self, rank, sizes, dtype, storage_offset=0):
        """Rank `rank`'s buffer as a tensor of this device: `sizes` of `dtype` from element
        storage_offset (contiguous)."""
        sizes = tuple(sizes) if not isinstance(sizes, int) else (sizes,)
        return self._view("get_buffer", self.buffer_ptrs, self.buffer_size, rank, sizes, dtype, storage_offset)

    def get_signal_pad(self, rank, sizes=None, dtype=torch.uint32, storage_offset=0):
        """Rank `rank`'s signal pad as a tensor (default: all of it, as uint32)."""
        if sizes is None or (not isinstance(sizes, int) and len(sizes) == 0):
            sizes = ((self.signal_pad_size - int(storage_offset) * _itemsize(dtype)) // _itemsize(dtype),)
        sizes = tuple(sizes) if not isinstance(sizes, int) else (sizes,)
        return self._view("get_signal_pad", self.signal_pad_ptrs, self.signal_pad_size, rank, sizes, dtype,
                          storage_offset)

    def _stream(self):
        return torch.cuda.current_stream(self._device).cuda_stream

    def barrier(self, channel=0, timeout_ms=0):
        """Every rank of the group reaches this point on its current stream before any goes on."""
        self._native.barrier(channel, timeout_ms, self._stream())

    def put_signal(self, dst_rank, channel=0, timeout_ms=0):
        """Signals dst_rank on channel, after everything this stream wrote before."""
        self._native.put_signal(dst_rank, channel, timeout_ms, self._stream())

    def wait_signal(self, src_rank, channel=0, timeout_ms=0):
        """Waits, on the current stream, for src_rank's put_signal on channel."""
        self._native.wait_signal(src_rank, channel, timeout_ms, self._stream())

    def put(self, dst_rank, tensor, storage_offset=0, blocks=0):
        """ferry's own (PyTorch's handle has no such call): copies `tensor` (contiguous, on this GPU)
        into rank dst_rank's buffer from element storage_offset of tensor's dtype, on the current
        stream: by the copy engines (blocks=0) or by that many thread blocks of SM stores. A
        put_signal after it tells dst_rank the bytes are there."""
        if not tensor.is_contiguous() or not tensor.is_cuda or tensor.device.index != self._device:
            raise ValueError(f"ferry.torch.symm put: rank {self.rank}: the tensor must be contiguous and on "
                             f"cuda:{self._device}, not {tensor.device} (contiguous: {tensor.is_contiguous()})")
        start = int(storage_offset) * tensor.element_size()
        self._native.put(dst_rank, start, tensor.data_ptr(), tensor.numel() * tensor.element_size(), blocks,
                         self._stream())

    def abort(self):
        """ferry's own: makes every signal wait of every rank's handle of this rendezvous give up at
        once (a peer is gone, the job is ending), instead of after FERRY_DEVICE_TIMEOUT with a trap
        that leaves the CUDA context unusable. The handle's buffers then hold whatever was written."""
        self._native.abort()
        # An aborted handle is done: the next rendezvous of the same memory, or the group's next
        # workspace, makes a new one rather than returning this one.
        with _lock:
            for key in [k for k, h in _handles.items() if h is self]:
                del _handles[key]
            for name in [n for n, (_, h) in _workspaces.items() if h is self]:
                del _workspaces[name]

    def has_multicast_support(self):
        return False
