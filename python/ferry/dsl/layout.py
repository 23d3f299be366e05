"""Lays a recorded CollectiveProgram out as a plan dict, applying instances and pipelining.

With ``instances = n`` and ``pipeline = k`` every logical chunk becomes F = n * k plan chunks:
logical chunk i of instance j, stage s is plan chunk ``i * F + j * k + s``. Interleaving keeps the
collective's chunk arithmetic intact (allgather's output chunk ``r * in + c`` still holds rank r's
input chunk c). Instance j gets its own copies of the thread blocks (plan thread block
``j * T + t``) and channels (plan channel ``j * C + c``; both ends are copied in the same order,
so the pairing rule still holds). Within a thread block the whole op list runs once per stage, stage
0 first, so stage s + 1 of one rank overlaps stage s of the next. A reference of c > 1 logical
chunks is not contiguous once F > 1; such an op becomes c single-chunk ops.

Example: input_chunks=2, instances=2 gives a plan with 4 input chunks; logical input[1] of
instance 1 is plan input[3].
"""

from __future__ import annotations

from .buffer import ChunkRef
from .rank import Rank
from .record import Op


def lay_out(prog) -> dict:
    """The plan dict of ``prog``, a CollectiveProgram (docs/plan-format.md, version 1); program.py
    calls it, so this module does not import that one."""
    plan = {
        "format": "ferry-plan",
        "version": 1,
        "name": prog.name,
        "collective": prog.collective,
        "protocol": prog.protocol,
        "inplace": prog.inplace,
        "world_size": prog.world_size,
        "chunks": {b: n * prog.instances * prog.pipeline for b, n in prog.chunks.items()},
        "min_bytes": prog.min_bytes,
        "max_bytes": prog.max_bytes,
        "ranks": [_rank(prog, rank) for rank in prog.ranks],
    }
    if prog.root is not None:
        plan["root"] = prog.root
    return plan


def _rank(prog, rank: Rank) -> dict:
    n, k = prog.instances, prog.pipeline
    channels = [{"type": ch.type, "peer": ch.peer} for _ in range(n) for ch in rank.channels]
    tbs = [rank.thread_blocks[t] for t in sorted(rank.thread_blocks)] or [[Op("barrier")] * rank.barriers]
    thread_blocks = []
    for j in range(n):
        mapping = _Mapping(n * k, j * k, j * len(rank.channels))
        for ops in tbs:
            out = [op_json for s in range(k) for op in ops for op_json in mapping.op(op, s)]
            thread_blocks.append({"id": len(thread_blocks), "ops": out})
    return {"rank": rank.rank, "channels": channels, "thread_blocks": thread_blocks}


class _Mapping:
    """Logical-to-plan numbering of one instance: chunk i, stage s -> i * factor + base + s."""

    def __init__(self, factor: int, base: int, channel_base: int):
        self.factor, self.base, self.channel_base = factor, base, channel_base

    def op(self, op: Op, stage: int) -> list[dict]:
        count = op.count()
        if self.factor == 1 or count <= 1:
            return [self._op(op, stage, None)]
        return [self._op(op, stage, i) for i in range(count)]

    def _op(self, op: Op, stage: int, part: int | None) -> dict:
        d: dict = {"op": op.kind}
        if op.channel is not None:
            d["channel"] = self.channel_base + op.channel.index
        if op.srcs:
            d["srcs"] = [self._src(s, stage, part) for s in op.srcs]
        if op.src is not None:
            d["src"] = self._ref(op.src, stage, part)
        if op.dst is not None:
            d["dst"] = self._ref(op.dst, stage, part)
        if op.kind == "read_reduce_copy_send":
            d["sends"] = [{"channel": self.channel_base + ch.index, "dst": self._ref(ref, stage, part)}
                          for ch, ref in op.sends]
        return d

    def _src(self, src, stage: int, part: int | None) -> dict:
        if isinstance(src, ChunkRef):
            return self._ref(src, stage, part)
        return {"channel": self.channel_base + src.channel.index, **self._ref(src.ref, stage, part)}

    def _ref(self, ref: ChunkRef, stage: int, part: int | None) -> dict:
        if part is not None:
            ref = ref.chunk(part)
        if self.factor == 1:
            return {"buffer": ref.buffer, "index": ref.index, "count": ref.count}
        return {"buffer": ref.buffer, "index": ref.index * self.factor + self.base + stage, "count": 1}
