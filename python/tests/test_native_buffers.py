"""How ferry.Comm reads its arguments, without a GPU: buffers from __cuda_array_interface__ and
(address, count, dtype), the refusals (host memory, strided arrays, unknown types), which stream a
call runs on, and that a Comm without a GPU is a clear ferry.Error."""

import os

import pytest

import ferry

if not ferry.native_available():
    if os.environ.get("FERRY_REQUIRE_NATIVE") == "1":
        ferry.require_native()
    pytest.skip("ferry._ferry is not built", allow_module_level=True)

from ferry.buffers import buffer_of, stream_of  # noqa: E402


class FakeArray:
    """What CuPy shows of a device array."""

    def __init__(self, shape, typestr="<f4", strides=None, address=0x7F0000000000):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (address, False),
            "strides": strides,
            "version": 3,
        }


def test_a_cuda_array_gives_its_address_count_and_type():
    b = buffer_of(FakeArray((4, 8), "<f2"))
    assert (b.address, b.count, b.dtype, b.kind) == (0x7F0000000000, 32, ferry.DataType.float16, "cuda_array")


def test_explicit_c_contiguous_strides_are_accepted_and_others_refused():
    assert buffer_of(FakeArray((4, 8), "<i8", strides=(64, 8))).count == 32
    assert buffer_of(FakeArray((1, 8), "<i8", strides=(0, 8))).count == 8  # a size-1 dimension's stride is free
    with pytest.raises(ferry.InvalidUsage, match="not C-contiguous"):
        buffer_of(FakeArray((4, 8), "<i8", strides=(8, 32)))


def test_unknown_types_and_non_buffers_are_value_errors_naming_the_argument():
    with pytest.raises(ValueError, match="typestr"):
        buffer_of(FakeArray((4,), "<c8"))
    with pytest.raises(ferry.InvalidUsage, match="output: list is not a buffer"):
        buffer_of([1, 2, 3], "output")


def test_a_raw_buffer_is_address_count_dtype():
    b = buffer_of((0x1000, 5, ferry.DataType.bfloat16))
    assert (b.address, b.count, b.dtype, b.kind) == (0x1000, 5, ferry.DataType.bfloat16, "raw")
    with pytest.raises(ferry.InvalidUsage):
        buffer_of((0x1000, -1, ferry.DataType.float32))


def test_raw_buffers_must_name_their_stream_and_zero_is_allowed_when_asked_for():
    raw = [buffer_of((0x1000, 5, ferry.DataType.float32))]
    with pytest.raises(ferry.InvalidUsage, match="must name its"):
        stream_of(None, raw)
    assert stream_of(0, raw) == 0
    assert stream_of(1234, raw) == 1234

    class TorchLikeStream:
        cuda_stream = 77

    class CupyLikeStream:
        ptr = 88

    assert stream_of(TorchLikeStream(), raw) == 77
    assert stream_of(CupyLikeStream(), raw) == 88
    with pytest.raises(ferry.InvalidUsage, match="not a stream"):
        stream_of("default", raw)


def test_a_comm_of_one_rank_is_made_with_a_gpu_and_is_a_ferry_error_without():
    os.environ.setdefault("FERRY_SOCKET_IFNAME", "lo")
    boot = ferry.TcpBootstrap.create(ferry.UniqueId.create(), 0, 1, timeout=10)
    if os.path.exists("/dev/nvidia0"):
        assert ferry.Comm(boot).world_size == 1
    else:
        with pytest.raises(ferry.Error):
            ferry.Comm(boot)


def test_a_dlpack_array_in_host_memory_is_refused_naming_where_it_is():
    np = pytest.importorskip("numpy")
    with pytest.raises(ferry.InvalidUsage, match="in host memory; ferry needs one in CUDA device memory"):
        buffer_of(np.zeros(8, dtype=np.float32), "input")


def test_dlpack_types_and_contiguity_are_read_before_the_device_is_judged():
    from ferry import buffers

    np = pytest.importorskip("numpy")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    info = ferry._ferry._dlpack_info(a)
    assert info[0] == a.ctypes.data and info[1] == [3, 4] and info[3:6] == (2, 32, 1)
    assert buffers._c_contiguous([3, 4], [4, 1]) and not buffers._c_contiguous([4, 3], [1, 4])
    assert buffers._c_contiguous([1, 4], [0, 1])
