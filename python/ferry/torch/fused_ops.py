"""The tensor-parallel ops of torch.distributed._symmetric_memory, in the namespace `ferry`, with
PyTorch's schemas, so that code and compiler passes port by changing the namespace:

    torch.ops.ferry.fused_all_gather_matmul(A_shard, [B0, B1], gather_dim, group_name, return_A=True)
        -> (A or None, [A @ B0, A @ B1])       A = all_gather(A_shard) along gather_dim
    torch.ops.ferry.fused_matmul_reduce_scatter(A, B, "sum" | "avg", scatter_dim, group_name)
        -> reduce_scatter(A @ B) along scatter_dim
    torch.ops.ferry.fused_all_gather_scaled_matmul(...)      the same with fp8 A and Bs (torch._scaled_mm)
    torch.ops.ferry.fused_scaled_matmul_reduce_scatter(...)

`group_name` is a process group's name (`group.group_name`). Every op runs on any device and any
backend of that group (the CPU tests use gloo). What runs by default is the unfused composition:
the collective on the group's backend (ferry's for CUDA tensors under "cuda:ferry"), then the
matmuls; fused_matmul_reduce_scatter sums the product's rows in float32, rounding once: on a
ferry group of one host by ferry's reduce-scatter with float32 accumulation (from C++), elsewhere
by an all-to-all of the rows in their own dtype and one sum of what arrives. Where the torch
extension is built, the composition is queued by it in C++ (python/torch_backend/fused_ops.cpp); the bodies here
run the other forms and are the ops' Meta implementations, so torch.compile traces them with fake
tensors. A matmul + reduce-scatter of a large product runs pipelined on symmetric
memory (fused_pipeline.py: its size table; FERRY_FUSED_PIPELINE=1 pipelines every call it can, =0
none). With FERRY_FUSED_REGISTERED=1, the composition's collectives on a ferry group run zero-copy
on registered workspaces (registered_workspace.py): opt-in, as it is not yet measured ahead of
the plain composition everywhere (docs/fused.md).

The scale modes of the fp8 variants are PyTorch's: A_scale is one value (tensor-wise), one per row
of this rank's shard (row-wise, sharded: gathered with A), or one per row of the gathered A
(row-wise, replicated); a B scale is one value or one per column.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ferry.torch import fused_pipeline, registered_workspace

_lib = torch.library.Library("ferry", "FRAGMENT")  # noqa: TOR901
_TAGS = (torch._C.Tag.needs_fixed_stride_order,)
_lib.define(
    "fused_all_gather_matmul(Tensor A, Tensor[] Bs, int gather_dim, str group_name, *, bool return_A = True)"
    " -> (Tensor?, Tensor[])",
    tags=_TAGS,
)
_lib.define(
    "fused_all_gather_scaled_matmul(Tensor A, Tensor[] Bs, Tensor A_scale, Tensor[] B_scales, int gather_dim,"
    " str group_name, Tensor?[] biases, Tensor?[] result_scales, ScalarType?[] out_dtypes, bool[] use_fast_accum)"
    " -> (Tensor, Tensor[])",
    tags=_TAGS,
)
_lib.define(
    "fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor",
    tags=_TAGS,
)
_lib.define(
    "fused_scaled_matmul_reduce_scatter(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, str reduce_op,"
    " int orig_scatter_dim, int scatter_dim_after_maybe_reshape, str group_name, SymInt[]? output_shape,"
    " Tensor? bias = None, Tensor? result_scale = None, ScalarType? out_dtype = None,"
    " bool use_fast_accum = False) -> Tensor",
    tags=_TAGS,
)

# The bodies below on every device. Where ferry's torch extension is built, it registers the four
# ops' CPU and CUDA kernels itself (python/torch_backend/fused_ops.cpp): the composition is queued
# from C++, on any backend, without this Python between the dispatcher and the GPU. The other forms
# (pipelined, registered workspaces) come back here through ferry::_composed_*, ops of the same
# schemas that only the extension calls. Meta (torch.compile's fake tensors) is always this Python.
_KEYS = ("Meta", "CPU", "CUDA")
_FUSED = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter", "fused_all_gather_scaled_matmul",
          "fused_scaled_matmul_reduce_scatter")
for _name in _FUSED:
    _schema = str(getattr(torch.ops.ferry, _name).default._schema).replace(f"ferry::{_name}", f"_composed_{_name[6:]}")
    _lib.define(_schema)


# The dispatch keys for which the extension registered op `name`'s kernel (it is loaded before this
# module): name -> ("CPU", "CUDA"), or () without the extension.
NATIVE_KEYS = {name: tuple(key for key in ("CPU", "CUDA")
                           if torch._C._dispatch_has_kernel_for_dispatch_key(f"ferry::{name}", key))
               for name in _FUSED}
if any(NATIVE_KEYS.values()):
    from ferry import _torch as _extension

    # The size table's one source is fused_pipeline.py: the C++ kernels defer to it from there.
    _extension._set_fused_pipeline_min_flops(fused_pipeline.AG_AUTO_MIN_FLOPS, fused_pipeline.RS_AUTO_MIN_FLOPS,
                                             fused_pipeline.SCALED_RS_AUTO_MIN_FLOPS)


def _impl(name):
    def register(fn):
        for key in _KEYS:
            if key in NATIVE_KEYS.get(name, ()):
                _lib.impl(f"_composed_{name[6:]}", fn, key)
            else:
                _lib.impl(name, fn, key)
        return fn

    return register


def _group_size(op: str, group_name: str) -> int:
    try:
        return c10d._get_group_size_by_name(group_name)
    except Exception as e:  # an unknown name: say which op and what to pass
        raise ValueError(
            f"ferry::{op}: no process group named {group_name!r} on rank {dist.get_rank()}: pass "
            "group.group_name of a group made with dist.new_group (or dist.group.WORLD.group_name)"
        ) from e


def _dim(op: str, what: str, dim: int, ndim: int) -> int:
    if not -ndim <= dim < ndim:
        raise ValueError(f"ferry::{op}: {what} {dim} is out of range for a {ndim}-D tensor")
    return dim % ndim


def _all_gather(shard: torch.Tensor, dim: int, size: int, group_name: str, slot: int = 0) -> torch.Tensor:
    """The shards of every rank, concatenated along dim (rank order). In a registered workspace
    (registered_workspace.py, `slot`) where that applies: the caller copies what it keeps."""
    # fp8 travels as bytes: gathering copies bits, and not every backend knows the fp8 types (gloo).
    wire = shard.contiguous()
    if wire.dtype.itemsize == 1 and wire.dtype.is_floating_point:
        wire = wire.view(torch.uint8)
    if registered_workspace.applies(wire, group_name):
        # In place in the workspace: this rank's shard at its own place, then an all-gather whose
        # input is that place, so that every buffer of the call is registered.
        group = c10d._resolve_process_group(group_name)
        here, count = dist.get_rank(group), wire.numel()
        ws = registered_workspace.get(group_name, slot, size * count * wire.element_size(), wire.device)
        flat = ws.view(wire.dtype)
        flat[here * count:(here + 1) * count].copy_(wire.reshape(-1))
        dist.all_gather_into_tensor(flat, flat[here * count:(here + 1) * count], group=group)
        flat = flat.view(shard.dtype)
    else:
        flat = torch.ops._c10d_functional.all_gather_into_tensor(wire, size, group_name)
        flat = torch.ops._c10d_functional.wait_tensor(flat).view(shard.dtype)
    # flat stacks the ranks' shards along a new leading dim; move it next to `dim` and merge.
    return flat.view(size, *shard.shape).movedim(0, dim).flatten(dim, dim + 1)


def _kept(A: torch.Tensor) -> torch.Tensor:
    """A gathered A the op returns: its own copy where it lies in a registered workspace (which the
    next call overwrites)."""
    return A.clone() if A.is_cuda and registered_workspace.holds(A) else A


def _reduce_scatter(full: torch.Tensor, op: str, reduce_op: str, dim: int, size: int, group_name: str):
    """This rank's part (along dim) of the sum or mean over ranks, accumulated in float32."""
    if reduce_op not in ("sum", "avg"):
        raise ValueError(f"ferry::{op}: reduce_op must be 'sum' or 'avg', not {reduce_op!r}")
    if full.shape[dim] % size != 0:
        raise ValueError(
            f"ferry::{op}: the result's dim {dim} has {full.shape[dim]} rows, not a multiple of the group's "
            f"{size} ranks"
        )
    # Rows travel in their own dtype (a float32 reduce-scatter would move twice the bytes of a
    # 16-bit product): one all-to-all brings this rank the n blocks of its rows, which it then sums
    # in float32 in one kernel, rounding once. Split along dim 0: bring `dim` there, and back after.
    moved = full.movedim(dim, 0).contiguous()
    blocks = moved.reshape(size, -1)  # block j: the rows rank j keeps
    # As bytes: the exchange copies bits, and not every backend knows every type (gloo and fp8).
    wire = blocks.view(torch.uint8)
    if registered_workspace.applies(wire, group_name):
        # Both sides in registered workspaces (the product may already be in slot 2: matmul wrote it there).
        nbytes = wire.numel()
        send = registered_workspace.get(group_name, 2, nbytes, wire.device)
        if send.data_ptr() != wire.data_ptr():
            send.copy_(wire.reshape(-1))
        recv = registered_workspace.get(group_name, 3, nbytes, wire.device)
        dist.all_to_all_single(recv, send, group=c10d._resolve_process_group(group_name))
        got = recv.view(size, -1).view(full.dtype)
    else:
        got = torch.ops._c10d_functional.all_to_all_single(wire, [1] * size, [1] * size, group_name)
        got = torch.ops._c10d_functional.wait_tensor(got).view(full.dtype)
    # torch sums 16-bit floats in float32 and rounds once: a sum is one kernel, with no float32
    # temporary; a mean divides before its one rounding.
    acc = got.sum(dim=0, dtype=torch.float32).div_(size) if reduce_op == "avg" else got.sum(dim=0)
    part = acc.view(moved.shape[0] // size, *moved.shape[1:])
    return part.movedim(0, dim).to(full.dtype)


def _matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    return torch.matmul(A, B)


@_impl("fused_all_gather_matmul")
def fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name, *, return_A=True):
    op = "fused_all_gather_matmul"
    size = _group_size(op, group_name)
    dim = _dim(op, "gather_dim", gather_dim, A_shard.dim())
    if fused_pipeline.chosen_for_all_gather(A_shard, dim, size, Bs, group_name):
        return fused_pipeline.all_gather_matmul(A_shard, Bs, group_name, return_A)
    A = _all_gather(A_shard, dim, size, group_name)
    outs = [_matmul(A, B) for B in Bs]
    return (_kept(A) if return_A else None), outs


@_impl("fused_matmul_reduce_scatter")
def fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name):
    op = "fused_matmul_reduce_scatter"
    size = _group_size(op, group_name)
    dim = _dim(op, "scatter_dim", scatter_dim, A.dim())
    if fused_pipeline.chosen_for_reduce_scatter(A, B, reduce_op, dim, size, group_name):
        return fused_pipeline.matmul_reduce_scatter(A, B, reduce_op, group_name)
    if dim == 0 and registered_workspace.applies(A, group_name) and A.shape[0] % size == 0:
        # The product straight into the registered workspace the all-to-all sends from.
        shape = (*A.shape[:-1], B.shape[-1])
        nbytes = torch.Size(shape).numel() * A.element_size()
        product = registered_workspace.get(group_name, 2, nbytes, A.device).view(A.dtype).view(shape)
        torch.matmul(A, B, out=product)
        return _reduce_scatter(product, op, reduce_op, dim, size, group_name)
    return _reduce_scatter(_matmul(A, B), op, reduce_op, dim, size, group_name)


def _scaled_mm(A, B, A_scale, B_scale, bias, result_scale, out_dtype, use_fast_accum):
    """A @ B of fp8 A (any leading dims) and B with their scales, as torch._scaled_mm computes it:
    (A * A_scale) @ (B * B_scale) accumulated in float32, plus bias. Where _scaled_mm cannot run
    (row-wise scales off CUDA), the same product of the dequantized operands."""
    lead = A.shape[:-1]
    A2 = A.flatten(0, -2)
    A_scale2 = A_scale.reshape(-1, 1) if A_scale.numel() > 1 else A_scale.reshape(())
    tensorwise = A_scale.numel() == 1 and B_scale.numel() == 1
    if A.device.type == "cuda" or tensorwise or A.device.type == "meta":
        out = torch._scaled_mm(A2, B, A_scale2.float(), B_scale.float(), bias, result_scale, out_dtype=out_dtype,
                               use_fast_accum=use_fast_accum)
    else:
        if result_scale is not None:
            raise NotImplementedError(
                "ferry::fused scaled ops: a result_scale with row-wise scales needs CUDA (torch._scaled_mm)")
        acc = (A2.float() * A_scale2.float()) @ (B.float() * B_scale.float().reshape(1, -1))
        if bias is not None:
            acc = acc + bias.float()
        out = acc.to(out_dtype or A.dtype)
    return out.unflatten(0, lead)


def _gathered_scale(op, A_shard, A_scale, dim, size, group_name):
    """A_scale for the gathered A, by PyTorch's three modes (see the module's docstring)."""
    if A_scale.numel() == 1:
        return A_scale
    rows_here = A_shard.numel() // A_shard.shape[-1]
    if A_scale.numel() == rows_here:  # one per row of this shard: gather them as A is gathered
        scale = A_scale.reshape(*A_shard.shape[:-1], 1)
        return _all_gather(scale, dim, size, group_name, slot=1)
    if A_scale.numel() == rows_here * size:  # one per row of the gathered A
        return A_scale
    raise ValueError(
        f"ferry::{op}: A_scale has {A_scale.numel()} values; expected 1 (tensor-wise), {rows_here} (one per row of "
        f"this rank's shard) or {rows_here * size} (one per row of the gathered A)"
    )


# A list of dtypes passed through the dispatcher as ScalarType?[] arrives as c10::ScalarType codes
# (c10/core/ScalarType.h; the codes only ever get appended to). The ones torch._scaled_mm writes:
_OUT_DTYPE_OF_CODE = {5: torch.float16, 6: torch.float32, 15: torch.bfloat16, 23: torch.float8_e5m2,
                      24: torch.float8_e4m3fn}


def _out_dtype(op, value):
    if value is None or isinstance(value, torch.dtype):
        return value
    if value in _OUT_DTYPE_OF_CODE:
        return _OUT_DTYPE_OF_CODE[value]
    raise ValueError(f"ferry::{op}: out_dtype code {value} is not one torch._scaled_mm writes")


@_impl("fused_all_gather_scaled_matmul")
def fused_all_gather_scaled_matmul(A_shard, Bs, A_scale, B_scales, gather_dim, group_name, biases, result_scales,
                                   out_dtypes, use_fast_accum):
    op = "fused_all_gather_scaled_matmul"
    n = len(Bs)
    for what, seq in (("B_scales", B_scales), ("biases", biases), ("result_scales", result_scales),
                      ("out_dtypes", out_dtypes), ("use_fast_accum", use_fast_accum)):
        if len(seq) != n:
            raise ValueError(f"ferry::{op}: {what} has {len(seq)} entries for {n} Bs")
    size = _group_size(op, group_name)
    dim = _dim(op, "gather_dim", gather_dim, A_shard.dim())
    if dim == A_shard.dim() - 1:
        raise ValueError(f"ferry::{op}: gather_dim must not be the last (contracted) dim of an fp8 A")
    A = _all_gather(A_shard, dim, size, group_name)
    scale = _gathered_scale(op, A_shard, A_scale, dim, size, group_name)
    outs = [_scaled_mm(A, B, scale, B_scale, bias, rs, _out_dtype(op, dt), fa)
            for B, B_scale, bias, rs, dt, fa in zip(Bs, B_scales, biases, result_scales, out_dtypes, use_fast_accum)]
    return _kept(A), outs


@_impl("fused_scaled_matmul_reduce_scatter")
def fused_scaled_matmul_reduce_scatter(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
                                       scatter_dim_after_maybe_reshape, group_name, output_shape, bias=None,
                                       result_scale=None, out_dtype=None, use_fast_accum=False):
    op = "fused_scaled_matmul_reduce_scatter"
    size = _group_size(op, group_name)
    C = _scaled_mm(A, B, A_scale, B_scale, bias, result_scale, _out_dtype(op, out_dtype), use_fast_accum)
    # PyTorch's async-TP pass may hand over A reshaped to 2-D (its rows then hold the original
    # leading dims): the product is viewed in the original shape before the scatter.
    if output_shape is not None:
        C = C.view(*output_shape[:-1], C.shape[-1])
    dim = _dim(op, "orig_scatter_dim", orig_scatter_dim, C.dim())
    return _reduce_scatter(C, op, reduce_op, dim, size, group_name)
