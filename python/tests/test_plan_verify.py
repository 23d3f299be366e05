"""The verifier proves correct plans and catches planted deadlocks, races and wrong results where they are."""

import pytest

from ferry.plan import load_plan
from ferry.plan.verify import Finding, main, verify
from plan_builders import (allgather, allreduce_allpairs, allreduce_packets, allreduce_two_shot, mutated,
                           ops_of, plan_doc, ref)


def findings_of(doc: dict) -> list[Finding]:
    return verify(load_plan(doc))


def kinds(findings) -> list[tuple]:
    return [(f.kind, f.rank, f.thread_block, f.op_index) for f in findings]


CORRECT = {
    "allgather2": allgather(2), "allgather4": allgather(4),
    "allgather4_two_blocks": allgather(4, two_blocks=True),
    "allreduce2": allreduce_allpairs(2), "allreduce4": allreduce_allpairs(4),
    "allreduce4_packets": allreduce_packets(4), "allreduce4_two_shot": allreduce_two_shot(4),
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_plans_verify_clean(name):
    assert findings_of(CORRECT[name]) == []


def test_wait_without_signal_is_a_deadlock_at_the_wait():
    # Rank 1's signal (op 2, on channel 0 to rank 0) is gone: rank 0's wait (op 3) starves.
    doc = mutated(allgather(2), lambda d: ops_of(d, 1).pop(2))
    found = findings_of(doc)
    assert kinds(found) == [("deadlock", 0, 0, 3)]
    assert "signal #1" in found[0].message and "only 0 times" in found[0].message


def test_barrier_missing_in_one_thread_block_is_a_deadlock():
    doc = mutated(allgather(2, two_blocks=True), lambda d: ops_of(d, 1, tb=1).pop(0))
    found = findings_of(doc)
    # tb 0 of rank 1 waits at its barrier (op 1) for tb 1, which finished without one.
    assert ("deadlock", 1, 0, 1) in kinds(found)
    assert "tb 1 finished without it" in next(f.message for f in found if f.thread_block == 0)


def test_reading_a_chunk_a_peer_puts_without_waiting_is_a_race():
    # Rank 1 copies output[0] (which rank 0 puts) into its scratch before waiting for rank 0's signal.
    def edit(d):
        d["chunks"]["scratch"] = 1
        ops_of(d, 1).insert(1, {"op": "copy", "src": ref("output", 0), "dst": ref("scratch", 0)})
    found = findings_of(mutated(allgather(2), edit))
    races = [f for f in found if f.kind == "race"]
    assert [(f.rank, f.thread_block, f.op_index) for f in races] == [(1, 0, 1)]
    assert "rank 0 tb 0 op 1" in races[0].message  # the put that wrote it


def test_two_thread_blocks_writing_one_chunk_unordered_is_a_race():
    # Without the barriers, tb 1's put reads output[r] while tb 0 may still be writing it; and a second
    # copy into output[r] from tb 1 races with tb 0's copy.
    def edit(d):
        for r in range(2):
            ops_of(d, r, 0).pop()      # tb 0: drop the barrier
            ops_of(d, r, 1).pop(0)     # tb 1: drop the barrier
            ops_of(d, r, 1).insert(0, {"op": "copy", "src": ref("input", 0), "dst": ref("output", r)})
    found = findings_of(mutated(allgather(2, two_blocks=True), edit))
    assert {(f.kind, f.rank, f.thread_block, f.op_index) for f in found} == {
        ("race", 0, 1, 0), ("race", 1, 1, 0)}
    assert "write by rank 0 tb 0 op 0" in next(f.message for f in found if f.rank == 0)


def test_channel_signalled_by_two_thread_blocks_is_nondeterministic():
    # Rank 0's tb 0 also signals channel 0 (after its barrier), and rank 1 waits once more: which of the
    # two signals rank 1's first wait pairs with depends on timing.
    def edit(d):
        ops_of(d, 0, 0).append({"op": "signal", "channel": 0})
        ops_of(d, 1, 1).append({"op": "wait", "channel": 0})
    found = findings_of(mutated(allgather(2, two_blocks=True), edit))
    assert ("nondeterministic", 0, 1, 2) in kinds(found)
    assert "tb 0 (op 2) also signals" in next(f.message for f in found if f.kind == "nondeterministic")


def test_scratch_chunk_filled_by_packets_twice_is_nondeterministic():
    doc = mutated(allreduce_packets(4), lambda d: ops_of(d, 0).insert(1, dict(ops_of(d, 0)[0])))
    found = findings_of(doc)
    assert ("nondeterministic", 0, 0, 1) in kinds(found)
    assert "scratch[0] of rank 1" in next(f.message for f in found if f.kind == "nondeterministic")


def test_chunk_summed_twice_is_a_wrong_result():
    # Rank 2 lists its own input twice in the final reduce.
    doc = mutated(allreduce_allpairs(4), lambda d: ops_of(d, 2)[-1]["srcs"].append(ref("input", 0)))
    found = findings_of(doc)
    assert kinds(found) == [("wrong_result", 2, 0, 9)]  # the reduce, the chunk's last writer
    assert found[0].message.startswith("rank 2 output[0]: ") and "extra in[2][0]" in found[0].message


def test_missing_contribution_is_a_wrong_result():
    doc = mutated(allreduce_allpairs(4), lambda d: ops_of(d, 1)[-1]["srcs"].pop(1))  # scratch[0]
    found = findings_of(doc)
    assert kinds(found) == [("wrong_result", 1, 0, 9)]
    assert "missing in[0][0]" in found[0].message


def test_missing_allgather_copy_leaves_garbage():
    found = findings_of(mutated(allgather(2), lambda d: ops_of(d, 1).pop(0)))
    assert kinds(found) == [("wrong_result", 1, None, None)]  # no op writes it: no op to point at
    assert found[0].message.startswith("rank 1 output[1]: expected in[1][0], found garbage(rank 1 output[1])")
    assert found[0].message.endswith("(no op writes it)")


def test_overwriting_the_input_of_a_plan_that_is_not_in_place_is_a_wrong_result():
    doc = mutated(allgather(2), lambda d: ops_of(d, 0).append(
        {"op": "copy", "src": ref("output", 1), "dst": ref("input", 0)}))
    assert kinds(findings_of(doc)) == [("wrong_result", 0, 0, 4)]


def test_inplace_allgather_aliases_input_into_output():
    # In place, input chunk 0 of rank r is output chunk r: the local copy is then a no-op.
    doc = mutated(allgather(2), lambda d: d.update(inplace=True))
    assert findings_of(doc) == []
    doc = mutated(doc, lambda d: [ops_of(d, r).pop(0) for r in range(2)])
    assert findings_of(doc) == []


def test_signal_without_wait_is_reported():
    doc = mutated(allgather(2), lambda d: ops_of(d, 0).append({"op": "signal", "channel": 0}))
    assert kinds(findings_of(doc)) == [("unmatched_signal", 0, 0, 4)]


def test_packets_never_sent_deadlock_the_unpack():
    doc = mutated(allreduce_packets(2), lambda d: ops_of(d, 0).pop(0))
    assert kinds(findings_of(doc)) == [("deadlock", 1, 0, 2)]


def test_out_of_range_reference_is_reported_with_its_location(tmp_path, capsys):
    doc = mutated(allreduce_allpairs(4), lambda d: ops_of(d, 2)[-1]["srcs"][1].update(index=6))
    path = tmp_path / "plan.json"
    path.write_text(__import__("json").dumps(doc))
    assert main([str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ('rank 2 tb 0 op 9: out_of_range: ranks[2].thread_blocks[0].ops[9].srcs[1].index: '
                      '6 is out of range for buffer "scratch" of 4 chunks (rank 2)')
    assert out[-1] == "verify: 1 finding in 1 plan"


def test_main_exits_zero_on_a_proven_plan(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(__import__("json").dumps(allreduce_two_shot(4)))
    assert main([str(path)]) == 0
    assert capsys.readouterr().out.strip() == "verify: 0 findings in 1 plan (all proven)"


def _port_allgather(n: int, edit) -> dict:
    """allgather(n) over port channels, edited by ``edit(doc)``."""
    def to_port(d):
        for r in d["ranks"]:
            for c in r["channels"]:
                c["type"] = "port"
        edit(d)
    return mutated(allgather(n), to_port)


def test_port_put_source_reused_before_flush_is_a_race_at_the_write():
    # Rank 0 overwrites its input (the put's source) right after the put, before any flush or signal.
    def edit(d):
        ops_of(d, 0).insert(2, {"op": "copy", "src": ref("output", 0), "dst": ref("input", 0)})
    found = findings_of(_port_allgather(2, edit))
    races = [f for f in found if f.kind == "race"]
    assert [(f.rank, f.thread_block, f.op_index) for f in races] == [(0, 0, 2)]
    assert "port-channel put by rank 0 tb 0 op 1" in races[0].message


def test_port_put_source_reused_after_flush_is_clean():
    def edit(d):
        ops_of(d, 0).insert(2, {"op": "flush", "channel": 0})
        ops_of(d, 0).insert(3, {"op": "copy", "src": ref("output", 0), "dst": ref("input", 0)})
    # The copy rewrites the same value (output[0] holds input[0]), so only ordering is at stake.
    assert [f for f in findings_of(_port_allgather(2, edit)) if f.kind == "race"] == []


def test_port_allgather_with_signals_verifies_clean():
    assert findings_of(_port_allgather(4, lambda d: None)) == []


def test_wrong_result_is_located_at_the_last_writer_on_another_rank():
    # Rank 0 puts never-written scratch instead of its input: rank 1's output[0] is wrong, and the put
    # (rank 0 tb 0 op 1) is what wrote it.
    def edit(d):
        d["chunks"]["scratch"] = 1
        ops_of(d, 0)[1]["src"] = ref("scratch", 0)
    found = findings_of(mutated(allgather(2), edit))
    assert kinds(found) == [("wrong_result", 0, 0, 1)]
    assert found[0].message.startswith("rank 1 output[0]: expected in[0][0], found garbage(rank 0 scratch[0])")
    assert str(found[0]).startswith("rank 0 tb 0 op 1: wrong_result: rank 1 output[0]")


# Port puts: the copy engine lands them some time after the put; only a flush or signal of the same
# port channel waits for that (src/executor/executor.cu), a memory channel's signal does not.

def _port_put_then_peer_reads(after_put: list, *, peer_waits_on: int = 1, tb1: list | None = None) -> dict:
    """Allgather of 2 ranks with channel 0 a port channel and channel 1 a memory channel on each. Rank 0
    tb 0 copies its chunk (op 0), puts it through port channel 0 into rank 1's output[0] (op 1), runs
    ``after_put`` and waits on channel 1; ``tb1``, if given, is its tb 1. Rank 1 sends its chunk back
    over memory channel 1, waits on channel ``peer_waits_on`` and then reads output[0] (op 4)."""
    put, copy, sig, wait = "put", "copy", "signal", "wait"
    r0 = [{"op": copy, "src": ref("input", 0), "dst": ref("output", 0)},
          {"op": put, "channel": 0, "src": ref("input", 0), "dst": ref("output", 0)},
          *after_put, {"op": wait, "channel": 1}]
    r1 = [{"op": copy, "src": ref("input", 0), "dst": ref("output", 1)},
          {"op": put, "channel": 1, "src": ref("input", 0), "dst": ref("output", 1)},
          {"op": sig, "channel": 1}, {"op": wait, "channel": peer_waits_on},
          {"op": copy, "src": ref("output", 0), "dst": ref("scratch", 0)}]
    tbs0 = [{"id": 0, "ops": r0}] + ([{"id": 1, "ops": tb1}] if tb1 is not None else [])
    ranks = [{"rank": r, "channels": [{"type": "port", "peer": 1 - r}, {"type": "memory", "peer": 1 - r}],
              "thread_blocks": tbs} for r, tbs in ((0, tbs0), (1, [{"id": 0, "ops": r1}]))]
    return plan_doc("allgather", 2, (1, 2, 1), ranks)


FLUSH0, SIGNAL0, SIGNAL1 = {"op": "flush", "channel": 0}, {"op": "signal", "channel": 0}, {"op": "signal", "channel": 1}


def test_port_put_ordered_by_a_memory_signal_alone_races_with_the_peer_read():
    found = findings_of(_port_put_then_peer_reads([SIGNAL1]))
    assert kinds(found) == [("race", 1, 0, 4), ("unflushed_put", 0, 0, 1)]
    assert "rank 1 output[0]" in found[0].message and "port-channel put by rank 0 tb 0 op 1" in found[0].message
    assert "no later flush or signal of that channel" in found[1].message


def test_port_put_flushed_only_after_the_memory_signal_still_races():
    found = findings_of(_port_put_then_peer_reads([SIGNAL1, FLUSH0]))
    assert kinds(found) == [("race", 1, 0, 4)]
    assert "rank 0 tb 0 op 1" in found[0].message


def test_port_put_then_port_signal_and_wait_is_clean():
    assert findings_of(_port_put_then_peer_reads([SIGNAL0], peer_waits_on=0)) == []


def test_port_put_then_flush_then_memory_signal_is_clean():
    # The flush returns once the copy engine has landed the put; the memory signal after it orders that.
    assert findings_of(_port_put_then_peer_reads([FLUSH0, SIGNAL1])) == []


def test_second_port_put_to_the_same_chunk_on_the_channel_lands_after_the_first():
    again = {"op": "put", "channel": 0, "src": ref("input", 0), "dst": ref("output", 0)}
    assert findings_of(_port_put_then_peer_reads([again, SIGNAL0], peer_waits_on=0)) == []


def test_port_put_source_overwritten_before_the_flush_is_a_race():
    overwrite = {"op": "copy", "src": ref("output", 0), "dst": ref("input", 0)}  # same value: ordering only
    found = findings_of(_port_put_then_peer_reads([overwrite, FLUSH0, SIGNAL1]))
    assert kinds(found) == [("race", 0, 0, 2)]
    assert "source of the port-channel put by rank 0 tb 0 op 1" in found[0].message
    assert findings_of(_port_put_then_peer_reads([FLUSH0, overwrite, SIGNAL1])) == []


def test_flush_by_another_thread_block_covers_only_puts_ordered_before_it():
    # Rank 0's tb 1 flushes channel 0 and signals: without the barriers the put may be queued after the
    # flush, so nothing waits for it.
    barrier = {"op": "barrier"}
    unordered = _port_put_then_peer_reads([], tb1=[FLUSH0, SIGNAL1])
    assert kinds(findings_of(unordered)) == [("race", 1, 0, 4), ("unflushed_put", 0, 0, 1)]
    ordered = _port_put_then_peer_reads([barrier], tb1=[barrier, FLUSH0, SIGNAL1])
    assert findings_of(ordered) == []


def test_a_plan_declaring_a_hundred_million_chunks_is_not_expanded():
    """A 2 KB plan may declare 10^8 chunks; the verifier answers at once instead of exhausting memory."""
    import time
    doc = mutated(allgather(2), lambda d: d["chunks"].update(input=10**8, output=2 * 10**8))
    start = time.monotonic()
    findings = verify(load_plan(doc))
    assert time.monotonic() - start < 5
    assert [f.kind for f in findings] == ["too_large"]
    assert "input 100000000, output 200000000" in findings[0].message
