"""ferry.Comm: the collectives of a group of ranks on tensors and arrays.

    import torch, ferry
    comm = ferry.Comm()                       # under torchrun: ranks meet through its store
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
from ferry._ferry import Accumulation, Collective, DataType, InvalidUsage, ReduceOp
from ferry.buffers import buffer_of, stream_of, torch_pair
from ferry.rendezvous import bootstrap_from_environment


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
    def __init__(self, bootstrap=None, *, device=None, min_blocks=0, max_blocks=0, connect=None):
        """Collective over `bootstrap`'s ranks on CUDA device `device` (default: the current one).
        Without a bootstrap, the ranks meet as rendezvous.py says: through torch.distributed's
        store or torchrun's agent store when there is one, else through torchrun's variables.
        min_blocks/max_blocks bound the thread blocks of a call; connect(communicator, peer) ->
        Connection, if given, makes the connection under the Comm's port channel to each peer
        (default: CUDA IPC), called on every rank for every peer in rank order."""
        if bootstrap is None:
            bootstrap = bootstrap_from_environment()
        self.bootstrap = bootstrap
        native = _ferry.Comm(bootstrap, device=device, min_blocks=min_blocks, max_blocks=max_blocks, connect=connect)
        self._adopt(native)

    def _adopt(self, native):
        # What every call reads, asked of the C++ Comm once (it never changes).
        self._native = native
        self.rank, self.world_size, self.device = native.rank, native.world_size, native.device

    communicator = property(lambda self: self._native.communicator, doc="For channels of the program's own.")
    topology = property(lambda self: self._native.topology)

    # -- buffers --------------------------------------------------------------------------------

    def _buffer(self, operation, name, obj):
        """The Buffer of argument `name`, which must be on the Comm's GPU when its GPU is known."""
        b = buffer_of(obj, (self.rank, operation, name))
        if b.device is not None and b.device != self.device:
            raise InvalidUsage(
                f"rank {self.rank}: {operation}: {name} is on cuda:{b.device}, but the Comm is on cuda:{self.device}"
            )
        return b

    def _pair(self, operation, tensor, out, gather=1, scatter=1):
        """Input and output Buffers of a call (output = input when `out` is None: in place), of one
        type, the output holding `gather` times the input's elements (all_gather: world_size), or
        the input `scatter` times the output's (reduce_scatter: world_size)."""
        i = self._buffer(operation, "input", tensor)
        if out is None:
            return i, i
        o = self._buffer(operation, "output", out)
        if i.dtype != o.dtype:
            raise InvalidUsage(f"rank {self.rank}: {operation}: input is {i.dtype.name}, output {o.dtype.name}")
        if scatter == 1 and o.count != i.count * gather:
            raise InvalidUsage(
                f"rank {self.rank}: {operation}: output holds {o.count} elements, expected {i.count * gather}"
            )
        if scatter != 1 and i.count != o.count * scatter:
            raise InvalidUsage(
                f"rank {self.rank}: {operation}: input holds {i.count} elements, expected {o.count * scatter}"
            )
        return i, o

    def _accumulation(self, name, op, accumulation):
        """The call's Accumulation (a ValueError for a value outside it), or None for the Comm's
        default (FERRY_ACCUMULATION); a PreMulSum sums stepwise. (Cheap on the default: every
        call's fast path goes through here.)"""
        if accumulation is None:
            return None
        if type(accumulation) is not Accumulation:
            accumulation = Accumulation(accumulation)
        if accumulation != Accumulation.stepwise and isinstance(op, PreMulSum):
            raise InvalidUsage(f"rank {self.rank}: {name}: a PreMulSum sums stepwise; pass no accumulation")
        return accumulation

    def _reducing(self, name, op, head, tail, accumulation=None):
        """Calls the native reducing collective `name` with head + the op's arguments + tail (+ the
        accumulation): a ReduceOp, or for a PreMulSum its _premul variant with the factor (a number
        goes to host memory as the call's type, which the C++ call reads before it returns)."""
        if not isinstance(op, PreMulSum):
            getattr(self._native, name)(*head, op if type(op) is ReduceOp else ReduceOp(op), *tail, accumulation)
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

    def all_reduce(self, tensor, out=None, op=ReduceOp.sum, *, accumulation=None, stream=None):
        """out[i] = op over ranks of tensor[i]; in place when `out` is None. Returns the output.
        `accumulation`: as reduce_scatter's."""
        accumulation = self._accumulation("all_reduce", op, accumulation)
        # Every call starts with the fast path for torch tensors on the current stream (torch_pair);
        # anything else, or anything wrong, takes the general path, which raises what is wrong.
        f = torch_pair(tensor, out, self.device) if stream is None and type(op) is ReduceOp else None
        if f is not None and f[2] == f[3]:
            self._native.all_reduce(f[0], f[1], f[2], f[4], op, f[5], accumulation)
            return tensor if out is None else out
        i, o = self._pair("all_reduce", tensor, out)
        self._reducing("all_reduce", op, (i.address, o.address, i.count, i.dtype), (stream_of(stream, (i, o)),),
                       accumulation)
        return tensor if out is None else out

    def all_gather(self, tensor, out, *, stream=None):
        """Rank r's `tensor` lands in block r of every rank's `out` (world_size blocks)."""
        f = torch_pair(tensor, out, self.device) if stream is None and out is not None else None
        if f is not None and f[3] == f[2] * self.world_size:
            self._native.all_gather(f[0], f[1], f[2], f[4], f[5])
            return out
        i, o = self._pair("all_gather", tensor, self._required("all_gather", out), gather=self.world_size)
        self._native.all_gather(i.address, o.address, i.count, i.dtype, stream_of(stream, (i, o)))
        return out

    def reduce_scatter(self, tensor, out, op=ReduceOp.sum, *, accumulation=None, stream=None):
        """Rank r's `out` = op over ranks of block r of `tensor` (world_size blocks). A sum or average
        of 16- and 8-bit floats adds up after each rank in their own type, as NCCL does
        (`accumulation=ferry.Accumulation.stepwise`), or in float32, rounded once, as torch.sum does
        (`ferry.Accumulation.float32`); None: FERRY_ACCUMULATION's (stepwise unless set)."""
        accumulation = self._accumulation("reduce_scatter", op, accumulation)
        f = torch_pair(tensor, out, self.device) if stream is None and out is not None else None
        if f is not None and f[2] == f[3] * self.world_size and type(op) is ReduceOp:
            self._native.reduce_scatter(f[0], f[1], f[3], f[4], op, f[5], accumulation)
            return out
        i, o = self._pair(
            "reduce_scatter", tensor, self._required("reduce_scatter", out), scatter=self.world_size
        )
        self._reducing("reduce_scatter", op, (i.address, o.address, o.count, i.dtype), (stream_of(stream, (i, o)),),
                       accumulation)
        return out

    def all_to_all(self, tensor, out, *, stream=None):
        """Block p of rank r's `tensor` lands in block r of rank p's `out` (world_size blocks each)."""
        i, o = self._pair("all_to_all", tensor, self._required("all_to_all", out))
        if i.count % self.world_size:
            raise InvalidUsage(
                f"rank {self.rank}: all_to_all: {i.count} elements do not split into {self.world_size} equal blocks"
            )
        self._native.all_to_all(i.address, o.address, i.count // self.world_size, i.dtype, stream_of(stream, (i, o)))
        return out

    def broadcast(self, tensor, root, out=None, *, stream=None):
        """`out` (default: `tensor`, in place) = the root's `tensor` on every rank."""
        f = torch_pair(tensor, out, self.device) if stream is None else None
        if f is not None and f[2] == f[3]:
            self._native.broadcast(f[0], f[1], f[2], f[4], root, f[5])
            return tensor if out is None else out
        i, o = self._pair("broadcast", tensor, out)
        self._native.broadcast(i.address, o.address, i.count, i.dtype, root, stream_of(stream, (i, o)))
        return tensor if out is None else out

    def reduce(self, tensor, root, out=None, op=ReduceOp.sum, *, accumulation=None, stream=None):
        """The root's `out` (default: `tensor`, in place) = op over ranks of `tensor`; other ranks'
        `out` is not written. `accumulation`: as reduce_scatter's."""
        accumulation = self._accumulation("reduce", op, accumulation)
        i, o = self._pair("reduce", tensor, out)
        self._reducing("reduce", op, (i.address, o.address, i.count, i.dtype), (root, stream_of(stream, (i, o))),
                       accumulation)
        return tensor if out is None else out

    def _required(self, operation, out):
        if out is None:
            raise InvalidUsage(f"rank {self.rank}: {operation}: the output buffer is required")
        return out

    # -- point to point -------------------------------------------------------------------------

    def send(self, tensor, peer, *, stream=None):
        b = self._buffer("send", "buffer", tensor)
        self._native.send(b.address, b.count, b.dtype, peer, stream_of(stream, (b,)))

    def recv(self, tensor, peer, *, stream=None):
        b = self._buffer("recv", "buffer", tensor)
        self._native.recv(b.address, b.count, b.dtype, peer, stream_of(stream, (b,)))
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
            b = self._buffer("register_buffer", "buffer", tensor)
            address, size = b.address, b.count * _ferry.size_of(b.dtype)
        return Registration(self, self._native.register_buffer(address, size))

    def algorithms(self):
        """Every algorithm of this Comm (AlgorithmInfo: name, collective, kind, constraints, forced,
        reduces_in_rank_order)."""
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

    def add_algorithm(self, algorithm):
        """Collective: adds a ferry.NativeAlgorithm (a Python subclass whose launch() queues a kernel
        of its own on call.stream); runs its setup(comm) on every rank. Returns its name."""
        self._native.add_algorithm(algorithm)
        return algorithm.name()

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
