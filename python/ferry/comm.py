"""ferry.Comm: the collectives of a group of ranks on tensors and arrays.

    import torch, ferry
    comm = ferry.Comm()                       # under torchrun: ranks meet through MASTER_ADDR
    x = torch.randn(1 << 20, device="cuda")
    comm.all_reduce(x)                        # in place, on torch's current stream
    comm.all_gather(x, out)                   # out holds world_size * x.numel() elements
    with comm.group():                        # sends and recvs that progress together
        comm.send(a, peer=1)
        comm.recv(b, peer=1)

Every call checks its buffers (CUDA memory of the Comm's GPU, contiguous, matching sizes and types)
and raises ferry.InvalidUsage, a ValueError, before anything is queued; every call is asynchronous
on its stream (buffers.py says which) and may be captured in a CUDA graph.
"""

import contextlib
import ctypes
import struct

from ferry import _ferry
from ferry._ferry import Collective, DataType, InvalidUsage, ReduceOp
from ferry.buffers import buffer_of, stream_of


class PreMulSum:
    """A sum of each rank's input times `factor`: a number (applied as the call's data type), or a
    one-element CUDA tensor/array of the call's type (read when the call runs)."""

    def __init__(self, factor):
        self.factor = factor


def _host_scalar(value, dtype):
    """A host buffer holding `value` as `dtype` (kept alive by the caller for the call)."""
    d = DataType(dtype)
    if d == DataType.float32:
        raw = struct.pack("<f", value)
    elif d == DataType.float64:
        raw = struct.pack("<d", value)
    elif d == DataType.float16:
        raw = struct.pack("<e", value)
    elif d == DataType.bfloat16:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
        raw = struct.pack("<H", (bits >> 16) & 0xFFFF)
    else:
        raise InvalidUsage(f"PreMulSum: a number as the factor of a {d.name} call; pass it as a device tensor")
    return ctypes.create_string_buffer(raw, len(raw))


class Registration:
    """A registered buffer range; deregisters when closed (it is also a context manager)."""

    def __init__(self, comm, registration_id):
        self._comm = comm
        self.id = registration_id

    def close(self):
        if self.id is not None:
            self._comm._native.deregister_buffer(self.id)
            self.id = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Comm:
    def __init__(self, bootstrap=None, *, device=None, min_blocks=0, max_blocks=0):
        """Collective over `bootstrap`'s ranks (default: TcpBootstrap.from_environment(), torchrun's
        variables) on CUDA device `device` (default: the current one)."""
        if bootstrap is None:
            bootstrap = _ferry.TcpBootstrap.from_environment()
        self.bootstrap = bootstrap
        self._adopt(_ferry.Comm(bootstrap, device=device, min_blocks=min_blocks, max_blocks=max_blocks))

    def _adopt(self, native):
        # What every call reads, asked of the C++ Comm once (it never changes).
        self._native = native
        self.rank, self.world_size, self.device = native.rank, native.world_size, native.device

    communicator = property(lambda self: self._native.communicator, doc="For channels of the program's own.")
    topology = property(lambda self: self._native.topology)

    # -- buffers --------------------------------------------------------------------------------

    def _buffers(self, operation, **named):
        out = {}
        for name, obj in named.items():
            if obj is None:
                out[name] = None
                continue
            b = buffer_of(obj, (self.rank, operation, name))
            if b.device is not None and b.device != self.device:
                raise InvalidUsage(
                    f"rank {self.rank}: {operation}: {name} is on cuda:{b.device}, but the Comm is on cuda:{self.device}"
                )
            out[name] = b
        return out

    def _same_type(self, operation, a, b):
        if a.dtype != b.dtype:
            raise InvalidUsage(f"rank {self.rank}: {operation}: input is {a.dtype.name}, output {b.dtype.name}")

    def _counts(self, operation, what, got, want):
        if got != want:
            raise InvalidUsage(f"rank {self.rank}: {operation}: {what} holds {got} elements, expected {want}")

    def _reducing(self, name, op, head, tail):
        """Calls the native reducing collective `name` with head + the op's arguments + tail: a
        ReduceOp, or for a PreMulSum its _premul variant with the factor (a number goes to host
        memory as the call's type, which the C++ call reads before it returns)."""
        if not isinstance(op, PreMulSum):
            getattr(self._native, name)(*head, ReduceOp(op), *tail)
            return
        dtype, f = head[3], op.factor
        if isinstance(f, (int, float)):
            scalar = _host_scalar(float(f), dtype)
            getattr(self._native, name + "_premul")(*head, ctypes.addressof(scalar), False, *tail)
            return
        fb = buffer_of(f, (self.rank, "PreMulSum", "factor"))
        if fb.count != 1 or fb.dtype != dtype:
            raise InvalidUsage(
                f"rank {self.rank}: PreMulSum factor: one element of the call's type ({dtype.name}), "
                f"not {fb.count} of {fb.dtype.name}"
            )
        getattr(self._native, name + "_premul")(*head, fb.address, True, *tail)

    # -- collectives ----------------------------------------------------------------------------

    def all_reduce(self, tensor, out=None, op=ReduceOp.sum, *, stream=None):
        """out[i] = op over ranks of tensor[i]; in place when `out` is None. Returns the output."""
        b = self._buffers("all_reduce", input=tensor, output=out)
        i, o = b["input"], b["output"] or b["input"]
        self._same_type("all_reduce", i, o)
        self._counts("all_reduce", "output", o.count, i.count)
        self._reducing("all_reduce", op, (i.address, o.address, i.count, i.dtype), (stream_of(stream, [i, o]),))
        return tensor if out is None else out

    def all_gather(self, tensor, out, *, stream=None):
        """Rank r's `tensor` lands in block r of every rank's `out` (world_size blocks)."""
        b = self._buffers("all_gather", input=tensor, output=out)
        i, o = b["input"], b["output"]
        self._same_type("all_gather", i, o)
        self._counts("all_gather", "output", o.count, i.count * self.world_size)
        self._native.all_gather(i.address, o.address, i.count, i.dtype, stream_of(stream, [i, o]))
        return out

    def reduce_scatter(self, tensor, out, op=ReduceOp.sum, *, stream=None):
        """Rank r's `out` = op over ranks of block r of `tensor` (world_size blocks)."""
        b = self._buffers("reduce_scatter", input=tensor, output=out)
        i, o = b["input"], b["output"]
        self._same_type("reduce_scatter", i, o)
        self._counts("reduce_scatter", "input", i.count, o.count * self.world_size)
        self._reducing("reduce_scatter", op, (i.address, o.address, o.count, i.dtype), (stream_of(stream, [i, o]),))
        return out

    def all_to_all(self, tensor, out, *, stream=None):
        """Block p of rank r's `tensor` lands in block r of rank p's `out` (world_size blocks each)."""
        b = self._buffers("all_to_all", input=tensor, output=out)
        i, o = b["input"], b["output"]
        self._same_type("all_to_all", i, o)
        self._counts("all_to_all", "output", o.count, i.count)
        if i.count % self.world_size:
            raise InvalidUsage(
                f"rank {self.rank}: all_to_all: {i.count} elements do not split into {self.world_size} equal blocks"
            )
        self._native.all_to_all(i.address, o.address, i.count // self.world_size, i.dtype, stream_of(stream, [i, o]))
        return out

    def broadcast(self, tensor, root, out=None, *, stream=None):
        """`out` (default: `tensor`, in place) = the root's `tensor` on every rank."""
        b = self._buffers("broadcast", input=tensor, output=out)
        i, o = b["input"], b["output"] or b["input"]
        self._same_type("broadcast", i, o)
        self._counts("broadcast", "output", o.count, i.count)
        self._native.broadcast(i.address, o.address, i.count, i.dtype, root, stream_of(stream, [i, o]))
        return tensor if out is None else out

    def reduce(self, tensor, root, out=None, op=ReduceOp.sum, *, stream=None):
        """The root's `out` (default: `tensor`, in place) = op over ranks of `tensor`; other ranks'
        `out` is not written."""
        b = self._buffers("reduce", input=tensor, output=out)
        i, o = b["input"], b["output"] or b["input"]
        self._same_type("reduce", i, o)
        self._counts("reduce", "output", o.count, i.count)
        self._reducing("reduce", op, (i.address, o.address, i.count, i.dtype), (root, stream_of(stream, [i, o])))
        return tensor if out is None else out

    # -- point to point -------------------------------------------------------------------------

    def send(self, tensor, peer, *, stream=None):
        b = self._buffers("send", buffer=tensor)["buffer"]
        self._native.send(b.address, b.count, b.dtype, peer, stream_of(stream, [b]))

    def recv(self, tensor, peer, *, stream=None):
        b = self._buffers("recv", buffer=tensor)["buffer"]
        self._native.recv(b.address, b.count, b.dtype, peer, stream_of(stream, [b]))
        return tensor

    @contextlib.contextmanager
    def group(self):
        """Sends and recvs inside progress together, as one kernel at the end of the block (an
        all-to-all-v is one group). An exception inside still closes the group."""
        self._native.group_start()
        try:
            yield self
        finally:
            self._native.group_end()

    # -- registration, algorithms, lifetime -----------------------------------------------------

    def register_buffer(self, tensor, nbytes=None):
        """Collective: registers the tensor's memory (or `tensor` as an address and `nbytes`) for the
        zero-copy algorithms. Returns a Registration (a context manager that deregisters)."""
        if isinstance(tensor, int):
            if nbytes is None:
                raise InvalidUsage(f"rank {self.rank}: register_buffer: an address needs its size in bytes")
            address, size = tensor, nbytes
        else:
            b = self._buffers("register_buffer", buffer=tensor)["buffer"]
            address, size = b.address, b.count * _ferry.size_of(b.dtype)
        return Registration(self, self._native.register_buffer(address, size))

    def algorithms(self):
        """Every algorithm of this Comm (AlgorithmInfo: name, collective, kind, constraints, forced)."""
        return self._native.algorithms()

    def set_algorithm(self, collective, name):
        """Forces algorithm `name` for `collective` (a Collective or its name); "" unforces."""
        self._native.set_algorithm(_collective(collective), name)

    def algorithm_for(self, collective, nbytes, dtype=DataType.float32, registered=False):
        return self._native.algorithm_for(_collective(collective), nbytes, DataType(dtype), registered)

    def add_plan(self, plan):
        """Collective: adds a plan as an algorithm of this Comm and returns its name ("plan:...").
        `plan`: a ferry.dsl program (anything with to_plan()), a dict in the plan format, a JSON
        string, or a path to a plan file."""
        import json
        import os

        if hasattr(plan, "to_plan"):
            return self._native.add_plan_json(json.dumps(plan.to_plan()), "a DSL program")
        if isinstance(plan, dict):
            return self._native.add_plan_json(json.dumps(plan), "a plan dict")
        if isinstance(plan, (str, os.PathLike)) and not str(plan).lstrip().startswith("{"):
            return self._native.add_plan_file(os.fspath(plan))
        if isinstance(plan, str):
            return self._native.add_plan_json(plan)
        raise InvalidUsage(f"rank {self.rank}: add_plan: {type(plan).__name__} is not a plan")

    def remove_algorithm(self, name):
        """Collective: removes algorithm `name` (a plan, a native or a built-in one)."""
        self._native.remove_algorithm(name)

    def abort(self):
        """Stops this Comm's kernels on every rank at once; later calls here raise InvalidUsage."""
        self._native.abort()

    @property
    def aborted(self):
        return self._native.aborted()


def _collective(c):
    """A Collective from itself or a name ("all_reduce", "allreduce", "AllReduce")."""
    if isinstance(c, Collective):
        return c
    by_name = {m.name.replace("_", ""): m for m in Collective}
    found = by_name.get(str(c).replace("_", "").lower())
    if found is None:
        raise InvalidUsage(f"{c!r} is not a collective ({', '.join(m.name for m in Collective)})")
    return found
