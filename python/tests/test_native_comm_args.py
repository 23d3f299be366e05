"""ferry.Comm's Python side without a GPU: what each call hands the C++ Comm (addresses, counts,
types, ops, roots, streams), and the refusals before anything is queued. The C++ Comm is replaced by
a recorder; the buffers are __cuda_array_interface__ stand-ins."""

import os

import pytest

import ferry

if not ferry.native_available():
    if os.environ.get("FERRY_REQUIRE_NATIVE") == "1":
        ferry.require_native()
    pytest.skip("ferry._ferry is not built", allow_module_level=True)

F32 = ferry.DataType.float32


class Recorder:
    rank, world_size, device = 1, 4, 0

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def record(*args):
            self.calls.append((name, *args))
            return 17 if name == "register_buffer" else None

        return record


class Array:
    def __init__(self, count, address, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": typestr, "data": (address, False),
                                         "strides": None, "version": 3}


def comm():
    c = ferry.Comm.__new__(ferry.Comm)
    c._adopt(Recorder())
    return c


def test_each_collective_passes_addresses_counts_and_the_stream():
    c = comm()
    a, b, big = Array(8, 0x1000), Array(8, 0x2000), Array(32, 0x3000)
    c.all_reduce(a, b, op=ferry.ReduceOp.max, stream=5)
    c.all_reduce(a, stream=5)
    c.all_gather(a, big, stream=5)
    c.reduce_scatter(big, a, stream=5)
    c.all_to_all(a, b, stream=5)
    c.broadcast(a, 2, stream=5)
    c.reduce(a, 3, b, op=ferry.ReduceOp.min, stream=5)
    with c.group():
        c.send(a, 0, stream=5)
        c.recv(b, 2, stream=5)
    assert c._native.calls == [
        ("all_reduce", 0x1000, 0x2000, 8, F32, ferry.ReduceOp.max, 5, None),
        ("all_reduce", 0x1000, 0x1000, 8, F32, ferry.ReduceOp.sum, 5, None),
        ("all_gather", 0x1000, 0x3000, 8, F32, 5),
        ("reduce_scatter", 0x3000, 0x1000, 8, F32, ferry.ReduceOp.sum, 5, None),
        ("all_to_all", 0x1000, 0x2000, 2, F32, 5),
        ("broadcast", 0x1000, 0x1000, 8, F32, 2, 5),
        ("reduce", 0x1000, 0x2000, 8, F32, ferry.ReduceOp.min, 3, 5, None),
        ("group_start",),
        ("send", 0x1000, 8, F32, 0, 5),
        ("recv", 0x2000, 8, F32, 2, 5),
        ("group_end",),
    ]


def test_a_premul_sum_passes_a_host_factor_of_the_calls_type_or_a_device_scalar():
    c = comm()
    c.all_reduce(Array(8, 0x1000), op=ferry.PreMulSum(0.5), stream=0)
    name, send, recv, count, dtype, factor, on_device, stream = c._native.calls[0]
    assert (name, send, count, dtype, on_device, stream) == ("all_reduce_premul", 0x1000, 8, F32, False, 0)
    assert factor != 0
    c.reduce_scatter(Array(32, 0x3000), Array(8, 0x1000), op=ferry.PreMulSum(Array(1, 0x9000)), stream=0)
    assert c._native.calls[1] == ("reduce_scatter_premul", 0x3000, 0x1000, 8, F32, 0x9000, True, 0)
    with pytest.raises(ferry.InvalidUsage, match="one element"):
        c.all_reduce(Array(8, 0x1000), op=ferry.PreMulSum(Array(2, 0x9000)), stream=0)


def test_the_reductions_pass_their_accumulation_and_a_premul_sum_takes_none():
    c = comm()
    f32 = ferry.Accumulation.float32
    c.reduce_scatter(Array(32, 0x3000, "<f2"), Array(8, 0x1000, "<f2"), op=ferry.ReduceOp.avg, accumulation=f32,
                     stream=5)
    c.reduce_scatter(Array(32, 0x3000), Array(8, 0x1000), accumulation=1, stream=5)
    c.all_reduce(Array(8, 0x1000, "<f2"), accumulation=f32, stream=5)
    c.reduce(Array(8, 0x1000, "<f2"), 2, accumulation=f32, stream=5)
    c.all_reduce(Array(8, 0x1000), accumulation=ferry.Accumulation.stepwise, stream=5)
    assert [call[-1] for call in c._native.calls] == [f32] * 4 + [ferry.Accumulation.stepwise]
    assert c._native.calls[3] == ("reduce", 0x1000, 0x1000, 8, ferry.DataType.float16, ferry.ReduceOp.sum, 2, 5, f32)
    for call in (lambda: c.reduce_scatter(Array(32, 0x3000), Array(8, 0x1000), op=ferry.PreMulSum(0.5),
                                          accumulation=f32, stream=0),
                 lambda: c.all_reduce(Array(8, 0x1000), op=ferry.PreMulSum(0.5), accumulation=f32, stream=0),
                 lambda: c.reduce(Array(8, 0x1000), 0, op=ferry.PreMulSum(0.5), accumulation=f32, stream=0)):
        with pytest.raises(ferry.InvalidUsage, match="PreMulSum sums stepwise"):
            call()
    with pytest.raises(ValueError):
        c.reduce_scatter(Array(32, 0x3000), Array(8, 0x1000), accumulation=7, stream=0)
    assert len(c._native.calls) == 5


def test_mismatched_sizes_and_types_are_refused_before_anything_is_queued():
    c = comm()
    with pytest.raises(ferry.InvalidUsage, match="all_gather: output holds 8 elements, expected 32"):
        c.all_gather(Array(8, 0x1000), Array(8, 0x2000), stream=0)
    with pytest.raises(ferry.InvalidUsage, match="float32, output float16"):
        c.all_reduce(Array(8, 0x1000), Array(8, 0x2000, "<f2"), stream=0)
    with pytest.raises(ferry.InvalidUsage, match="equal blocks"):
        c.all_to_all(Array(6, 0x1000), Array(6, 0x2000), stream=0)
    with pytest.raises(ferry.InvalidUsage, match="must name its"):
        c.all_reduce((0x1000, 8, F32))
    assert c._native.calls == []


def test_register_buffer_returns_a_registration_that_deregisters_once():
    c = comm()
    with c.register_buffer(Array(8, 0x1000)) as reg:
        assert reg.id == 17
    reg.close()
    assert c._native.calls == [("register_buffer", 0x1000, 32), ("deregister_buffer", 17)]


def test_collectives_are_named_as_users_write_them():
    c = comm()
    c.set_algorithm("allreduce", "allreduce_ll")
    c.set_algorithm("all_gather", "")
    assert c._native.calls == [("set_algorithm", ferry.Collective.all_reduce, "allreduce_ll"),
                               ("set_algorithm", ferry.Collective.all_gather, "")]
    with pytest.raises(ferry.InvalidUsage, match="not a collective"):
        c.set_algorithm("gossip", "x")
