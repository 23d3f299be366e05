"""What a Comm call is given, made into what the C++ library takes: a device address, an element
count and a DataType for each buffer, and a cudaStream_t for the call.

Buffers may be:
- a torch.Tensor on a CUDA device, contiguous;
- anything with ``__cuda_array_interface__`` (CuPy, Numba), C-contiguous;
- anything with ``__dlpack__`` (JAX, ...) whose memory is on a CUDA device, C-contiguous;
- a tuple ``(address, count, dtype)`` for memory the caller manages.

Streams: an int (a cudaStream_t; 0 is the legacy default stream, only when asked for), a
torch.cuda.Stream, a CuPy stream (anything with ``.ptr`` or ``.cuda_stream``). Without one, a call on
torch tensors runs on torch's current stream of the tensors' device and a call on CuPy arrays on
CuPy's current stream; a call on raw addresses must name its stream, so that nothing lands on the
legacy default stream by accident.
"""

from ferry._ferry import DataType, InvalidUsage, _dlpack_info

# torch dtype names (str(tensor.dtype)) and __cuda_array_interface__ typestrs, to DataType.
_TORCH_TYPES = {
    "torch.int8": DataType.int8,
    "torch.uint8": DataType.uint8,
    "torch.int32": DataType.int32,
    "torch.uint32": DataType.uint32,
    "torch.int64": DataType.int64,
    "torch.uint64": DataType.uint64,
    "torch.float16": DataType.float16,
    "torch.float32": DataType.float32,
    "torch.float64": DataType.float64,
    "torch.bfloat16": DataType.bfloat16,
    "torch.float8_e4m3fn": DataType.float8_e4m3,
    "torch.float8_e5m2": DataType.float8_e5m2,
}
_TYPESTRS = {
    "i1": DataType.int8,
    "u1": DataType.uint8,
    "i4": DataType.int32,
    "u4": DataType.uint32,
    "i8": DataType.int64,
    "u8": DataType.uint64,
    "f2": DataType.float16,
    "f4": DataType.float32,
    "f8": DataType.float64,
}


# DLPack (type code, bits) to DataType; device types.
_DLPACK_TYPES = {
    (0, 8): DataType.int8,
    (1, 8): DataType.uint8,
    (0, 32): DataType.int32,
    (1, 32): DataType.uint32,
    (0, 64): DataType.int64,
    (1, 64): DataType.uint64,
    (2, 16): DataType.float16,
    (2, 32): DataType.float32,
    (2, 64): DataType.float64,
    (4, 16): DataType.bfloat16,
    (10, 8): DataType.float8_e4m3,  # float8_e4m3fn
    (12, 8): DataType.float8_e5m2,
}
_DL_CUDA = 2
_DL_DEVICES = {1: "host memory", 3: "pinned host memory", 13: "CUDA managed memory"}


class Buffer:
    """One resolved buffer: address, element count, DataType, the CUDA device (None: unknown), and
    the kind of object it came from ("torch", "cuda_array", "raw")."""

    __slots__ = ("address", "count", "dtype", "device", "kind")

    def __init__(self, address, count, dtype, device, kind):
        self.address = address
        self.count = count
        self.dtype = dtype
        self.device = device
        self.kind = kind


def _label(what):
    """`what` as an error message names it: a string, or (rank, operation, argument), which a call
    passes so that no text is built unless something is wrong."""
    if isinstance(what, tuple):
        rank, operation, name = what
        return f"rank {rank}: {operation}: {name}"
    return what


# The hot path: every collective call resolves its buffers and its stream, and Python adds what it
# costs to every call. So a buffer's kind is found once per Python type (_READERS) and a torch
# dtype's DataType once per dtype (_TORCH_BY_DTYPE); the torch path reads only what it needs.
_READERS = {}
_TORCH_BY_DTYPE = {}


def buffer_of(obj, what="buffer"):
    """The Buffer that `obj` describes; InvalidUsage (a ValueError) naming `what` (_label) when it is host
    memory, not contiguous, of a type ferry has no DataType for, or not a buffer at all."""
    reader = _READERS.get(type(obj))
    if reader is None:
        reader = _READERS[type(obj)] = _reader_for(obj)
    return reader(obj, what)


def _reader_for(obj):
    if type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
        return _from_torch
    if hasattr(obj, "__cuda_array_interface__"):
        return lambda o, what: _from_cuda_array_interface(o.__cuda_array_interface__, what)
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack
    if isinstance(obj, tuple):
        return _from_raw
    return _not_a_buffer


def _from_torch(obj, what):
    if not obj.is_cuda:
        raise InvalidUsage(f"{_label(what)}: a torch tensor on {obj.device}; ferry needs one on a CUDA device")
    if not obj.is_contiguous():
        raise InvalidUsage(f"{_label(what)}: the tensor is not contiguous; pass tensor.contiguous()")
    dtype = _TORCH_BY_DTYPE.get(obj.dtype)
    if dtype is None:
        dtype = _TORCH_TYPES.get(str(obj.dtype))
        if dtype is None:
            raise InvalidUsage(f"{_label(what)}: ferry has no data type for {obj.dtype}")
        _TORCH_BY_DTYPE[obj.dtype] = dtype
    return Buffer(obj.data_ptr(), obj.numel(), dtype, obj.get_device(), "torch")


def torch_pair(a, b, device):
    """The fast path of a call on torch tensors: (address of a, address of b, count of a, count of
    b, DataType, torch's current stream) when `a` and `b` (None: b is a) are contiguous CUDA tensors
    of one known dtype on `device`; else None, and the call takes the general path (buffer_of,
    stream_of), which also says what is wrong. Nothing here builds an object it does not return."""
    if _READERS.get(type(a)) is not _from_torch or not (a.is_cuda and a.is_contiguous() and a.get_device() == device):
        return None
    dtype = _TORCH_BY_DTYPE.get(a.dtype)
    if dtype is None:
        return None
    address, count = a.data_ptr(), a.numel()
    if b is None:
        return address, address, count, count, dtype, _torch_current_stream(device)
    if (
        _READERS.get(type(b)) is not _from_torch
        or not (b.is_cuda and b.is_contiguous() and b.get_device() == device)
        or b.dtype is not a.dtype
    ):
        return None
    return address, b.data_ptr(), count, b.numel(), dtype, _torch_current_stream(device)


def _from_raw(obj, what):
    if len(obj) == 3:
        address, count, dtype = obj
        if isinstance(address, int) and isinstance(count, int) and count >= 0:
            return Buffer(address, count, DataType(dtype), None, "raw")
    raise InvalidUsage(f"{_label(what)}: a raw buffer is (address: int, count: int >= 0, dtype), not {obj!r}")


def _not_a_buffer(obj, what):
    raise InvalidUsage(
        f"{_label(what)}: {type(obj).__name__} is not a buffer ferry takes (a CUDA torch tensor, an object with "
        "__cuda_array_interface__ or __dlpack__, or (address, count, dtype))"
    )


def _from_cuda_array_interface(cai, what):
    typestr = cai["typestr"]
    dtype = _TYPESTRS.get(typestr[1:])
    if dtype is None:
        raise InvalidUsage(f"{_label(what)}: ferry has no data type for typestr {typestr!r}")
    if typestr[0] == ">":
        raise InvalidUsage(f"{_label(what)}: big-endian data ({typestr!r}) is not supported")
    shape = tuple(cai["shape"])
    count = 1
    for n in shape:
        count *= n
    strides = cai.get("strides")  # in bytes
    itemsize = int(typestr[2:])
    if strides is not None and count > 1:
        if any(s % itemsize for s in strides) or not _c_contiguous(shape, [s // itemsize for s in strides]):
            raise InvalidUsage(f"{_label(what)}: the array is not C-contiguous (strides {tuple(strides)})")
    address = cai["data"][0]
    return Buffer(address, count, dtype, None, "cuda_array")


def _c_contiguous(shape, strides):
    """True when `strides` (in elements) are C order's for `shape`, ignoring size-1 dimensions."""
    expected = 1
    for n, stride in zip(reversed(shape), reversed(strides)):
        if n != 1 and stride != expected:
            return False
        expected *= n
    return True


def _from_dlpack(obj, what):
    address, shape, strides, code, bits, lanes, device_type, device_id = _dlpack_info(obj)
    if device_type != _DL_CUDA:
        place = _DL_DEVICES.get(device_type, f"DLPack device type {device_type}")
        raise InvalidUsage(f"{_label(what)}: the array is in {place}; ferry needs one in CUDA device memory")
    dtype = _DLPACK_TYPES.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        raise InvalidUsage(f"{_label(what)}: ferry has no data type for DLPack type (code {code}, {bits} bits, {lanes} lanes)")
    count = 1
    for n in shape:
        count *= n
    if strides is not None and count > 1 and not _c_contiguous(shape, strides):
        raise InvalidUsage(f"{_label(what)}: the array is not C-contiguous (strides {tuple(strides)} elements)")
    return Buffer(address, count, dtype, device_id, "dlpack")


def stream_of(stream, buffers):
    """The cudaStream_t (an int) of a call on `buffers`: `stream` if given, else the current stream
    of the library the buffers come from. InvalidUsage for raw buffers without a stream."""
    if stream is not None:
        if isinstance(stream, int):
            return stream
        for attr in ("cuda_stream", "ptr"):
            handle = getattr(stream, attr, None)
            if isinstance(handle, int):
                return handle
        raise InvalidUsage(f"stream: {type(stream).__name__} is not a stream (an int, torch.cuda.Stream, CuPy stream)")
    for b in buffers:
        if b.kind == "torch":
            return _torch_current_stream(b.device)
    for b in buffers:
        if b.kind == "cuda_array":
            try:
                import cupy
            except ImportError:
                break
            return cupy.cuda.get_current_stream().ptr
    raise InvalidUsage(
        "stream: a call on raw addresses, DLPack arrays (or arrays of a library ferry does not know) "
        "must name its stream (stream=0 for the legacy default stream)"
    )


def _torch_current_stream(device):
    """torch's current stream of `device` as a cudaStream_t. torch.cuda.current_stream() makes a
    Stream object per call (microseconds); torch's own compiler reads the raw handle through
    torch._C._cuda_getCurrentRawStream, so ferry does too where it exists. The first call binds
    the function this name refers to from then on."""
    global _torch_current_stream
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _torch_current_stream = raw or (lambda d: torch.cuda.current_stream(d).cuda_stream)
    return _torch_current_stream(device)
