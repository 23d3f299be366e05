"""Channel-level reduce and broadcast: what they record, that programs built on them verify clean,
and that misuse is refused."""

import pytest

from ferry.dsl import CollectiveProgram, MemoryChannel, PortChannel
from ferry.dsl.channel import Channel
from ferry.plan.load import load_plan
from ferry.plan.verify import verify


def _pairs(w, kind=MemoryChannel):
    return {(r, p): kind(r, p) for r in range(w) for p in range(w) if r != p}


def allreduce_by_channel_reduce(w: int) -> CollectiveProgram:
    """Every rank copies its input to its output, then folds in each peer's input read over a memory
    channel, after the peer said its input is ready; a final handshake keeps inputs alive."""
    with CollectiveProgram("ar_channel_reduce", "allreduce", world_size=w, input_chunks=1) as prog:
        ch = _pairs(w)
        for r in range(w):
            me = prog.rank(r)
            me.copy(me.input[0], me.output[0], tb=0)
            peers = [p for p in range(w) if p != r]
            for p in peers:
                ch[r, p].signal(tb=0)
            for p in peers:
                ch[p, r].pair.wait(tb=0)
                ch[r, p].reduce(prog.rank(p).input[0], me.output[0], tb=0)
    return prog


def allgather_by_broadcast(w: int) -> CollectiveProgram:
    with CollectiveProgram("ag_broadcast", "allgather", world_size=w, input_chunks=1) as prog:
        ch = _pairs(w)
        for r in range(w):
            me = prog.rank(r)
            me.copy(me.input[0], me.output[r], tb=0)
            Channel.broadcast([ch[r, p] for p in range(w) if p != r], me.input[0], me.output[r], tb=0)
            for p in range(w):
                if p != r:
                    ch[p, r].pair.wait(tb=0)
    return prog


@pytest.mark.parametrize("w", [2, 4])
def test_channel_reduce_builds_a_correct_allreduce(w):
    plan = allreduce_by_channel_reduce(w).to_plan()
    reduces = [o for o in plan["ranks"][0]["thread_blocks"][0]["ops"] if o["op"] == "reduce"]
    assert len(reduces) == w - 1
    assert reduces[0]["srcs"][1]["channel"] == 0  # the peer's input, read over the channel
    assert verify(load_plan(plan)) == []


@pytest.mark.parametrize("w", [2, 4, 8])
def test_broadcast_builds_a_correct_allgather(w):
    plan = allgather_by_broadcast(w).to_plan()
    ops = [o["op"] for o in plan["ranks"][1]["thread_blocks"][0]["ops"]]
    assert ops == ["copy"] + ["put"] * (w - 1) + ["signal"] * (w - 1) + ["wait"] * (w - 1)
    assert verify(load_plan(plan)) == []


def test_misuse_is_refused():
    with CollectiveProgram("bad", "allreduce", world_size=2, input_chunks=1) as prog:
        port = PortChannel(0, 1)
        with pytest.raises(ValueError, match="reduce needs a MemoryChannel"):
            port.reduce(prog.rank(1).input[0], prog.rank(0).output[0], tb=0)
        mem = MemoryChannel(0, 1)
        with pytest.raises(ValueError, match="expected a chunk of rank 1"):
            mem.reduce(prog.rank(0).input[0], prog.rank(0).output[0], tb=0)
        with pytest.raises(ValueError, match="no channels"):
            Channel.broadcast([], prog.rank(0).input[0], prog.rank(0).output[0], tb=0)
        with pytest.raises(ValueError, match="is rank 1's end; use .pair"):
            Channel.broadcast([mem, mem.pair], prog.rank(0).input[0], prog.rank(0).output[0], tb=0)
