"""The pipelined forms of fused_all_gather_matmul and fused_matmul_reduce_scatter, on symmetric
memory (symm.py), for CUDA tensors: the matmul of each rank's chunk runs as soon as that chunk is
there, while copies of the next chunks run beside it on a second stream (the copy engine: a copy
between this GPU and a peer's mapped memory).

All-gather + matmul: every rank puts its shard in the group's symmetric workspace and the ranks
meet once (a signal-pad barrier); then this rank multiplies its own shard at once, and each peer's
shard after the side stream has pulled it (a stream waits on an event, the host never waits).
A closing barrier keeps a rank from rewriting its workspace while a peer still reads it.

Matmul + reduce-scatter: for each other rank, the rows that rank keeps are multiplied and the
product pushed into that rank's workspace (slot = this rank) while the next rows are multiplied;
after a barrier every rank sums the n partial products of its rows in float32, in rank order, and
rounds once.

Opt-in while it is being measured: FERRY_FUSED_PIPELINE=1. It applies to 2-D and 3-D A gathered or
scattered along dim 0, contiguous; fused_ops.py runs the unfused composition everywhere else.
Not run on a GPU yet (docs/pytorch.md).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

_side_streams = {}  # device index -> the copy stream


def enabled() -> bool:
    return os.environ.get("FERRY_FUSED_PIPELINE") == "1"


def _side(device):
    s = _side_streams.get(device.index)
    if s is None:
        s = _side_streams[device.index] = torch.cuda.Stream(device)
    return s


def applies(t: torch.Tensor, dim: int, size: int) -> bool:
    """Whether the pipelined form runs a call with t (A or A_shard) split along dim over size ranks."""
    return (enabled() and t.is_cuda and dim == 0 and t.dim() in (2, 3) and t.is_contiguous() and size > 1
            and not isinstance(t, torch._subclasses.FakeTensor))


def _workspace(group, nbytes):
    from ferry.torch import symm

    return symm.get_symm_mem_workspace(group, nbytes)


def all_gather_matmul(A_shard, Bs, group_name, return_A):
    group = c10d._resolve_process_group(group_name)
    n, r = group.size(), dist.get_rank(group)
    m = A_shard.shape[0]
    ws = _workspace(group, A_shard.numel() * A_shard.element_size())
    cur, side = torch.cuda.current_stream(A_shard.device), _side(A_shard.device)
    ws.get_buffer(r, A_shard.shape, A_shard.dtype).copy_(A_shard)
    ws.barrier(channel=0)  # every rank's shard is in its workspace
    A = A_shard.new_empty((n * m, *A_shard.shape[1:]))
    outs = [A_shard.new_empty((n * m, *A_shard.shape[1:-1], B.shape[-1])) for B in Bs]
    side.wait_stream(cur)
    pulled = []
    with torch.cuda.stream(side):
        for step in range(1, n):
            src = (r + step) % n
            A[src * m:(src + 1) * m].copy_(ws.get_buffer(src, A_shard.shape, A_shard.dtype))
            done = torch.cuda.Event()
            done.record(side)
            pulled.append((src, done))
    A.record_stream(side)  # the caching allocator must not reuse A while the side stream writes it
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
    cur, side = torch.cuda.current_stream(A.device), _side(A.device)
    ws.barrier(channel=0)  # every rank has summed what the previous call put in its workspace
    side.wait_stream(cur)
    for step in range(1, n):
        dst = (r + step) % n
        product = torch.matmul(A[dst * m:(dst + 1) * m], B)
        made = torch.cuda.Event()
        made.record(cur)
        side.wait_event(made)
        with torch.cuda.stream(side):
            ws.get_buffer(dst, part_shape, A.dtype, storage_offset=r * part_elems).copy_(product)
        product.record_stream(side)
    own = torch.matmul(A[r * m:(r + 1) * m], B)
    cur.wait_stream(side)
    ws.barrier(channel=0)  # every rank's product for this rank's rows is in this rank's workspace
    acc = None
    for src in range(n):  # rank order, in float32 for 16-bit types
        p = own if src == r else ws.get_buffer(r, part_shape, A.dtype, storage_offset=src * part_elems)
        p = p.float() if p.dtype in (torch.float16, torch.bfloat16) else p
        acc = p.clone() if acc is None else acc.add_(p)
    if reduce_op == "avg":
        acc.div_(n)
    return acc.to(A.dtype)
