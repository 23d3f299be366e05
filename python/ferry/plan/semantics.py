"""What a plan's buffers mean symbolically: chunk values, buffer aliasing, and the collective's answer.

A value is a sorted tuple of atoms (a multiset): ``("in", r, i)`` is input chunk i of rank r as it was
when the collective started, ``("garbage", r, buffer, i)`` whatever a chunk held before the plan ran.
A reduction is the multiset union, so ``in[0][1] + in[1][1]`` and its double-counted variants stay
distinguishable; a copy copies the tuple.
"""

from __future__ import annotations

from collections import Counter

from .model import Plan

Value = tuple
Slot = tuple  # (rank, buffer, index) after aliasing; the identity of one chunk of memory


def input_atom(rank: int, index: int) -> Value:
    return (("in", rank, index),)


def garbage(slot: Slot) -> Value:
    return (("garbage",) + slot,)


def reduce_values(values: list[Value]) -> Value:
    return tuple(sorted(a for v in values for a in v))


def slot(plan: Plan, rank: int, buffer: str, index: int) -> Slot:
    """The memory a chunk reference names; with ``inplace`` input and output share chunks as in NCCL."""
    if plan.inplace:
        if plan.collective == "allgather" and buffer == "input":
            return (rank, "output", rank * plan.chunks.input + index)
        if plan.collective == "reducescatter" and buffer == "output":
            return (rank, "input", rank * plan.chunks.output + index)
        if plan.collective not in ("allgather", "reducescatter") and buffer == "output":
            return (rank, "input", index)
    return (rank, buffer, index)


def initial_memory(plan: Plan) -> dict[Slot, Value]:
    """Every input chunk holds its own atom; chunks absent from the map hold garbage."""
    return {slot(plan, r, "input", i): input_atom(r, i)
            for r in range(plan.world_size) for i in range(plan.chunks.input)}


def expected_output(plan: Plan, rank: int, index: int) -> Value:
    """The value output chunk ``index`` of ``rank`` must hold when the collective completes."""
    n, cin, cout = plan.world_size, plan.chunks.input, plan.chunks.output
    if plan.collective == "allreduce":
        return reduce_values([input_atom(j, index) for j in range(n)])
    if plan.collective == "allgather":
        return input_atom(index // cin, index % cin)
    if plan.collective == "reducescatter":
        return reduce_values([input_atom(j, rank * cout + index) for j in range(n)])
    if plan.collective == "alltoall":
        block = cin // n
        return input_atom(index // block, rank * block + index % block)
    assert plan.collective == "broadcast"
    return input_atom(plan.root, index)


def describe(value: Value) -> str:
    """Compact text of a value, e.g. ``in[0][1] + 2*in[1][1]`` or ``garbage(rank 1 output[2])``."""
    terms = []
    for atom, k in sorted(Counter(value).items()):
        text = f"in[{atom[1]}][{atom[2]}]" if atom[0] == "in" else f"garbage(rank {atom[1]} {atom[2]}[{atom[3]}])"
        terms.append(text if k == 1 else f"{k}*{text}")
    return " + ".join(terms)


def describe_mismatch(expected: Value, found: Value) -> str:
    """``expected X, found Y``; for long sums, what is missing and extra instead of the whole of Y."""
    if len(expected) <= 3:
        return f"expected {describe(expected)}, found {describe(found)}"
    exp, got = Counter(expected), Counter(found)
    missing, extra = exp - got, got - exp
    parts = [f"missing {describe(tuple(missing.elements()))}"] if missing else []
    parts += [f"extra {describe(tuple(extra.elements()))}"] if extra else []
    return f"expected {describe(expected)}, found that {'; '.join(parts)}"
