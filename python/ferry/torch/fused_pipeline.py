"""The pipelined forms of fused_all_gather_matmul and fused_matmul_reduce_scatter in Python, on
symmetric memory (symm.py), for CUDA tensors. Where the torch extension is built, a group of ferry's
backend runs the C++ form instead (python/torch_backend/fused_pipeline.cpp: pushed copies and a
device-side flag per chunk, no host between the steps); this one runs on other groups (with
FERRY_FUSED_PIPELINE=1) and without the extension. Here the matmul of each rank's chunk runs as
soon as that chunk is there, while copies of the next chunks run beside it on side streams (the
copy engines: a copy between this GPU and a peer's mapped memory).

All-gather + matmul: every rank puts its shard in the group's symmetric workspace and the ranks
meet once (a signal-pad barrier); then this rank multiplies its own shard at once, and each peer's
shard after a side stream has pulled it (a stream waits on an event, the host never waits).
A closing barrier keeps a rank from rewriting its workspace while a peer still reads it.

Matmul + reduce-scatter: for each other rank, the rows that rank keeps are multiplied and the
product pushed into that rank's workspace (slot = this rank) while the next rows are multiplied;
this rank's own rows are multiplied into its own slot. After a barrier every rank sums the n
partial products of its rows in float32 (one reduction kernel) and rounds once.

The copies to or from each peer run on a stream of their own, so that they share the copy engines.

It applies to 2-D and 3-D A (strided or not) gathered or scattered along dim 0; fused_ops.py runs the
unfused composition everywhere else. Which form runs (the size table; docs/fused.md has the run
that set it): FERRY_FUSED_PIPELINE=1 pipelines every call it applies to, =0 none; unset, on a
ferry group, a matmul + reduce-scatter whose product takes at least RS_AUTO_MIN_FLOPS per rank (an
all-gather + matmul: AG_AUTO_MIN_FLOPS; a scaled reduce-scatter: SCALED_RS_AUTO_MIN_FLOPS) is
pipelined and everything else runs the composition. The C++ kernels read the thresholds from here.
"""

from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

_side_streams = {}  # (device index, step) -> a copy stream


# Where the pipelined matmul + reduce-scatter wins by default: products of at least this many
# flops per rank (2 x rows x K x N). Its C++ form on 2 H100 (docs/fused.md) was 1.05-1.23x the
# composition at shapes of 2.4e11-2.7e11 flops (and even at one), and 0.53-0.67x at 6e10; the Python
# form on 4 H100 was the faster one at every shape of 4.8e11 and more, the slower at 1.4e11 and less.
RS_AUTO_MIN_FLOPS = 2e11
# The same for the all-gather + matmul (the gathered A's products with every B): never by default.
# Its C++ form on 2 H100 was 0.93-1.03x the composition at M = 4096 and 16384: the shard's copy
# (copy engine) ran at about half the SM-driven all-gather's rate.
AG_AUTO_MIN_FLOPS = math.inf
# The same for the scaled (fp8) matmul + reduce-scatter (torch._scaled_mm per chunk; ferry groups,
# C++ only). On 2 H100 (2026-11-28, three runs) it was 1.06-1.21x the composition in every run at
# four of the seven shapes of 2.75e11 flops and more and 0.97-1.18x at the other three, 0.97-1.03x
# at 2.4e11 and mostly slower below: an fp8 matmul is twice as fast, so a product must be larger
# before its copies hide under it.
SCALED_RS_AUTO_MIN_FLOPS = 2.5e11


def mode() -> str:
    """FERRY_FUSED_PIPELINE: "on" (1), "off" (0) or "auto" (unset: the size table)."""
    return {"1": "on", "0": "off"}.get(os.environ.get("FERRY_FUSED_PIPELINE", ""), "auto")


def _side(device, step):
    """The copy stream of one peer step: a stream per peer, so that the copies to (or from)
    different peers run side by side on the GPU's copy engines instead of one after another."""
    s = _side_streams.get((device.index, step))
    if s is None:
        s = _side_streams[(device.index, step)] = torch.cuda.Stream(device)
    return s


def _applies(t: torch.Tensor, dim: int, size: int) -> bool:
    """Whether the pipelined form can run a call with t (A or A_shard) split along dim over size ranks."""
    # (Not contiguity: every rank must pick the same form from the call's shape; copy_ and matmul
    # take strided tensors.)
    return (t.is_cuda and dim == 0 and t.dim() in (2, 3) and size > 1
            and not isinstance(t, torch._subclasses.FakeTensor))


def chosen_for_all_gather(A_shard: torch.Tensor, dim: int, size: int, Bs=(), group_name: str = "") -> bool:
    """Whether fused_all_gather_matmul runs pipelined: FERRY_FUSED_PIPELINE=1, or unset, on a group of
    ferry's backend, products of at least AG_AUTO_MIN_FLOPS."""
    how = mode()
    if how == "off" or not _applies(A_shard, dim, size):
        return False
    if how == "on":
        return True
    from ferry.torch import registered_workspace

    flops = sum(2 * size * A_shard.numel() * B.shape[-1] for B in Bs)
    return flops >= AG_AUTO_MIN_FLOPS and registered_workspace.is_ferry_group(group_name, A_shard.device)


def chosen_for_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, dim: int, size: int,
                              group_name: str) -> bool:
    """Whether fused_matmul_reduce_scatter runs pipelined: FERRY_FUSED_PIPELINE=1, or unset, on a
    group of ferry's backend (its ranks share a host, as symmetric memory needs), and a product of
    at least RS_AUTO_MIN_FLOPS."""
    how = mode()
    if how == "off" or reduce_op not in ("sum", "avg") or not _applies(A, dim, size) or A.shape[0] % size:
        return False
    if how == "on":
        return True
    from ferry.torch import registered_workspace

    large = 2 * A.numel() * B.shape[-1] >= RS_AUTO_MIN_FLOPS
    return large and registered_workspace.is_ferry_group(group_name, A.device)


def _workspace(group, nbytes):
    from ferry.torch import symm

    return symm.get_symm_mem_workspace(group, nbytes)


def all_gather_matmul(A_shard, Bs, group_name, return_A):
    group = c10d._resolve_process_group(group_name)
    n, r = group.size(), dist.get_rank(group)
    m = A_shard.shape[0]
    ws = _workspace(group, A_shard.numel() * A_shard.element_size())
    cur = torch.cuda.current_stream(A_shard.device)
    ws.get_buffer(r, A_shard.shape, A_shard.dtype).copy_(A_shard)
    ws.barrier(channel=0)  # every rank's shard is in its workspace
    A = A_shard.new_empty((n * m, *A_shard.shape[1:]))
    outs = [A_shard.new_empty((n * m, *A_shard.shape[1:-1], B.shape[-1])) for B in Bs]
    pulled = []
    for step in range(1, n):
        src, side = (r + step) % n, _side(A_shard.device, step)
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            A[src * m:(src + 1) * m].copy_(ws.get_buffer(src, A_shard.shape, A_shard.dtype))
            done = torch.cuda.Event()
            done.record(side)
        pulled.append((src, done))
        A.record_stream(side)  # the caching allocator must not reuse A while a side stream writes it
    if return_A:
        A[r * m:(r + 1) * m].copy_(A_shard)
    for B, out in zip(Bs, outs):
        torch.matmul(A_shard, B, out=out[r * m:(r + 1) * m])
    for src, done in pulled:
        cur.wait_event(done)
        for B, out in zip(Bs, outs):
            torch.matmul(A[src * m:(src + 1) * m], B, out=out[src * m:(src + 1) * m])
    ws.barrier(channel=0)  # every peer has read this rank's shard
    return (A if return_A else None), outs


def matmul_reduce_scatter(A, B, reduce_op, group_name):
    group = c10d._resolve_process_group(group_name)
    n, r = group.size(), dist.get_rank(group)
    m = A.shape[0] // n
    part_shape = (m, *A.shape[1:-1], B.shape[-1])
    part_elems = torch.Size(part_shape).numel()
    ws = _workspace(group, n * part_elems * A.element_size())
    cur = torch.cuda.current_stream(A.device)
    ws.barrier(channel=0)  # every rank has summed what the previous call put in its workspace
    sides = []
    for step in range(1, n):
        dst, side = (r + step) % n, _side(A.device, step)
        product = torch.matmul(A[dst * m:(dst + 1) * m], B)
        side.wait_stream(cur)  # the product is made
        with torch.cuda.stream(side):
            ws.get_buffer(dst, part_shape, A.dtype, storage_offset=r * part_elems).copy_(product)
        product.record_stream(side)
        sides.append(side)
    # This rank's own product goes straight into its slot of its own workspace.
    own = ws.get_buffer(r, part_shape, A.dtype, storage_offset=r * part_elems)
    torch.matmul(A[r * m:(r + 1) * m], B, out=own)
    for side in sides:
        cur.wait_stream(side)
    ws.barrier(channel=0)  # every rank's product for this rank's rows is in this rank's workspace
    # The n products of this rank's rows lie side by side: one kernel sums them in float32.
    acc = ws.get_buffer(r, (n, *part_shape), A.dtype).sum(dim=0, dtype=torch.float32)
    if reduce_op == "avg":
        acc.div_(n)
    return acc.to(A.dtype)
