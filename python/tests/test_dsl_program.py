"""DSL unit behaviour: chunk slicing, argument checks, channel pairing, barriers, plan fields."""

import pytest

from ferry.dsl import CollectiveProgram, MemoryChannel, PortChannel, SwitchChannel
from ferry.dsl.buffer import ChunkRef
from ferry.plan.load import load_plan


def make(collective="allreduce", w=4, **kw):
    kw.setdefault("input_chunks", 4)
    return CollectiveProgram("t", collective, world_size=w, **kw)


def test_slicing_gives_chunk_refs():
    prog = make(scratch_chunks=3)
    r = prog.rank(2)
    assert r.input[1] == ChunkRef(2, "input", 1, 1)
    assert r.output[1:3] == ChunkRef(2, "output", 1, 2)
    assert r.scratch[:] == ChunkRef(2, "scratch", 0, 3)
    assert len(r.scratch) == 3


@pytest.mark.parametrize("key", [4, slice(3, 5), slice(2, 2), -1])
def test_out_of_range_names_rank_and_buffer(key):
    with pytest.raises(IndexError, match=r'rank 1 buffer "input": chunks \[.*\) are out of range of 4 chunks'):
        make().rank(1).input[key]


def test_empty_scratch_and_bad_index_types():
    prog = make()
    with pytest.raises(IndexError, match='rank 0 buffer "scratch"'):
        prog.rank(0).scratch[0]
    with pytest.raises(ValueError, match="no step"):
        prog.rank(0).input[0:4:2]
    with pytest.raises(TypeError):
        prog.rank(0).input["a"]


@pytest.mark.parametrize("collective,ins,outs", [("allreduce", 4, 4), ("allgather", 4, 16),
                                                 ("reducescatter", 4, 1), ("alltoall", 4, 4)])
def test_output_chunks_follow_the_collective(collective, ins, outs):
    assert make(collective, input_chunks=ins).chunks == {"input": ins, "output": outs, "scratch": 0}


def test_bad_arguments():
    with pytest.raises(ValueError, match="collective"):
        make("allsum")
    with pytest.raises(ValueError, match="divisible"):
        make("reducescatter", input_chunks=3)
    with pytest.raises(ValueError, match="root"):
        make("broadcast")
    with pytest.raises(ValueError, match="rank 4 does not exist"):
        make().rank(4)


def test_channels_need_an_active_program():
    with pytest.raises(RuntimeError, match="active CollectiveProgram"):
        MemoryChannel(0, 1)


def test_channel_pairs_follow_the_pairing_rule():
    with make() as prog:
        a = MemoryChannel(0, 1)
        b = PortChannel(0, 1)
        c = MemoryChannel(1, 0)
        d = MemoryChannel(0, 2)
        e = SwitchChannel(2, 0)
    assert (e.index, e.pair.index, e.pair.type) == (1, 4, "switch")
    assert (a.index, a.pair.index, a.pair.rank, a.pair.pair) == (0, 0, 1, a)
    assert (b.index, b.pair.index) == (1, 1)
    assert (c.index, c.pair.index) == (2, 2)   # the 2nd memory channel 1->0 pairs with the 2nd 0->1
    assert (d.index, d.pair.index) == (3, 0)
    plan = prog.to_plan()
    assert plan["ranks"][0]["channels"] == [{"type": "memory", "peer": 1}, {"type": "port", "peer": 1},
                                            {"type": "memory", "peer": 1}, {"type": "memory", "peer": 2},
                                            {"type": "switch", "peer": 2}]
    assert plan["ranks"][2]["channels"] == [{"type": "memory", "peer": 0}, {"type": "switch", "peer": 0}]


def test_ops_check_ownership_counts_and_channel_types():
    with make(scratch_chunks=2) as prog:
        r0, r1 = prog.rank(0), prog.rank(1)
        ch = MemoryChannel(0, 1)
        port = PortChannel(0, 1)
    with pytest.raises(ValueError, match="belongs to rank 1"):
        r0.copy(r1.input[0], r0.output[0], tb=0)
    with pytest.raises(ValueError, match="same chunk count"):
        r0.copy(r0.input[0:2], r0.output[0], tb=0)
    with pytest.raises(ValueError, match="expected a chunk of rank 1"):
        ch.put(r0.input[0], r0.output[0], tb=0)
    with pytest.raises(ValueError, match="use .pair"):
        r1.reduce([ch.remote(r1.input[0])], r1.output[0], tb=0)
    with pytest.raises(ValueError, match="needs a PortChannel"):
        ch.flush(tb=0)
    with pytest.raises(ValueError, match="needs a MemoryChannel"):
        port.get(r1.input[0], r0.output[0], tb=0)
    with pytest.raises(ValueError, match="peer's scratch"):
        ch.put_packets(r0.input[0], r1.output[0], tb=0)
    with pytest.raises(ValueError, match="src must be scratch"):
        r0.reduce_packets(r0.input[0], r0.output[0], tb=0)
    with pytest.raises(ValueError, match="tb must be"):
        r0.copy(r0.input[0], r0.output[0], tb=-1)


def test_plan_ops_and_barriers():
    with make(scratch_chunks=2) as prog:
        r0, r1 = prog.rank(0), prog.rank(1)
        ch = MemoryChannel(0, 1)
        r0.copy(r0.input[0:2], r0.output[0:2], tb=3)
        r0.barrier()
        r0.reduce([r0.output[0], ch.remote(r1.input[0])], r0.output[0], tb=3)
        r0.read_reduce_copy_send([r0.input[2]], r0.output[2], [(ch, r1.scratch[0])], tb=7)
    tbs = prog.to_plan()["ranks"][0]["thread_blocks"]
    assert [t["id"] for t in tbs] == [0, 1]   # tb 3 and 7 become positions 0 and 1
    assert [o["op"] for o in tbs[0]["ops"]] == ["copy", "barrier", "reduce"]
    assert [o["op"] for o in tbs[1]["ops"]] == ["barrier", "read_reduce_copy_send"]
    assert tbs[0]["ops"][0]["src"] == {"buffer": "input", "index": 0, "count": 2}
    assert tbs[0]["ops"][2]["srcs"][1] == {"channel": 0, "buffer": "input", "index": 0, "count": 1}
    assert tbs[1]["ops"][1]["sends"] == [{"channel": 0, "dst": {"buffer": "scratch", "index": 0, "count": 1}}]
    plan = prog.to_plan()
    assert plan["ranks"][3]["thread_blocks"] == [{"id": 0, "ops": []}]
    load_plan(plan)


def test_instances_and_pipeline_interleave_chunks_and_copy_blocks_and_channels():
    with make("allgather", w=2, input_chunks=2, instances=2, pipeline=3) as prog:
        r0, r1 = prog.rank(0), prog.rank(1)
        ch = MemoryChannel(0, 1)
        ch.put(r0.input[1], r1.output[1], tb=0)
        ch.signal(tb=0)
    plan = prog.to_plan()
    assert plan["chunks"] == {"input": 12, "output": 24, "scratch": 0}
    rank0 = plan["ranks"][0]
    assert rank0["channels"] == [{"type": "memory", "peer": 1}] * 2
    assert len(rank0["thread_blocks"]) == 2
    inst1 = rank0["thread_blocks"][1]["ops"]
    # instance 1, stages 0..2: logical chunk 1 -> 1 * 6 + 1 * 3 + stage
    assert [(o["op"], o.get("channel"), o.get("src", {}).get("index")) for o in inst1] == [
        ("put", 1, 9), ("signal", 1, None), ("put", 1, 10), ("signal", 1, None), ("put", 1, 11), ("signal", 1, None)]
    assert plan["ranks"][1]["channels"] == [{"type": "memory", "peer": 0}] * 2


def test_multi_chunk_refs_split_when_interleaved():
    with make(w=2, input_chunks=2, instances=2) as prog:
        r0 = prog.rank(0)
        r0.copy(r0.input[0:2], r0.output[0:2], tb=0)
    ops = prog.to_plan()["ranks"][0]["thread_blocks"][1]["ops"]
    assert [(o["src"]["index"], o["src"]["count"]) for o in ops] == [(1, 1), (3, 1)]


def test_broadcast_plan_carries_its_root_and_verifies():
    from ferry.plan.verify import verify
    with CollectiveProgram("bcast", "broadcast", world_size=3, input_chunks=2, root=1) as prog:
        src = prog.rank(1)
        src.copy(src.input[0:2], src.output[0:2], tb=0)
        for p in (0, 2):
            ch = MemoryChannel(1, p)
            ch.put(src.input[0:2], prog.rank(p).output[0:2], tb=0)
            ch.signal(tb=0)
            ch.pair.wait(tb=0)
    plan = prog.to_plan()
    assert plan["root"] == 1
    assert verify(load_plan(plan)) == []
