"""Turning a Plan back into its JSON document: ``load_plan(dump_plan(p)) == p`` for every valid plan."""

from __future__ import annotations

from .model import FORMAT, VERSION, ChunkRef, Op, Plan


def dump_plan(plan: Plan) -> dict:
    """The plan as a JSON-ready dict in the field order of docs/plan-format.md."""
    doc = {"format": FORMAT, "version": VERSION, "name": plan.name, "collective": plan.collective}
    if plan.root is not None:
        doc["root"] = plan.root
    doc.update({
        "protocol": plan.protocol,
        "inplace": plan.inplace,
        "world_size": plan.world_size,
        "chunks": {"input": plan.chunks.input, "output": plan.chunks.output, "scratch": plan.chunks.scratch},
        "min_bytes": plan.min_bytes,
        "max_bytes": plan.max_bytes,
        "ranks": [{
            "rank": r.rank,
            "channels": [{"type": c.type, "peer": c.peer} for c in r.channels],
            "thread_blocks": [{"id": tb.id, "ops": [_op(op) for op in tb.ops]} for tb in r.thread_blocks],
        } for r in plan.ranks],
    })
    return doc


def _op(op: Op) -> dict:
    d: dict = {"op": op.kind}
    if op.channel is not None:
        d["channel"] = op.channel
    if op.kind in ("reduce", "read_reduce_copy_send"):
        d["srcs"] = [_ref(s) for s in op.srcs]
    if op.src is not None:
        d["src"] = _ref(op.src)
    if op.dst is not None:
        d["dst"] = _ref(op.dst)
    if op.kind == "read_reduce_copy_send":
        d["sends"] = [{"channel": s.channel, "dst": _ref(s.dst)} for s in op.sends]
    return d


def _ref(ref: ChunkRef) -> dict:
    d: dict = {"buffer": ref.buffer, "index": ref.index, "count": ref.count}
    if ref.channel is not None:
        d["channel"] = ref.channel
    return d
