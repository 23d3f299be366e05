"""The loader accepts valid plans, round-trips them, and rejects every malformed one with a PlanError
that names the JSON path and the rank, never with another exception."""

import copy
import json
import os
import random

import pytest

from ferry.plan import PlanError, dump_plan, load_plan
from ferry.plan.verify import verify
from plan_builders import (allgather, allreduce_allpairs, allreduce_packets, allreduce_two_shot, mutated,
                           ops_of, plan_doc, ref)

VALID = [allgather(2), allgather(4, two_blocks=True), allreduce_allpairs(4), allreduce_packets(2),
         allreduce_two_shot(4)]


@pytest.mark.parametrize("doc", VALID, ids=lambda d: d["name"] + str(len(d["ranks"][0]["thread_blocks"])))
def test_round_trip(doc, tmp_path):
    plan = load_plan(doc)
    assert dump_plan(plan) == doc
    assert load_plan(dump_plan(plan)) == plan
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(dump_plan(plan)))
    assert load_plan(str(path)) == plan


def rejected(doc) -> PlanError:
    with pytest.raises(PlanError) as info:
        load_plan(doc)
    return info.value


@pytest.mark.parametrize("edit, message", [
    (lambda d: ops_of(d, 2)[-1]["srcs"][1].update(index=6),
     'ranks[2].thread_blocks[0].ops[9].srcs[1].index: 6 is out of range for buffer "scratch" of 4 chunks (rank 2)'),
    (lambda d: ops_of(d, 1)[0].update(channel=3),
     "ranks[1].thread_blocks[0].ops[0].channel: channel 3 does not exist (this rank has 3) (rank 1)"),
    (lambda d: ops_of(d, 0)[0]["dst"].update(index=1, count=4),
     'ranks[0].thread_blocks[0].ops[0].dst.count: chunks [1, 5) run past buffer "scratch" of 4 chunks (rank 0)'),
    (lambda d: ops_of(d, 0)[-1]["srcs"][1].update(count=2),
     "ranks[0].thread_blocks[0].ops[9]: references of one op must have the same count, found [1, 2] (rank 0)"),
    (lambda d: d["ranks"][3]["channels"][2].update(type="port"),
     "ranks[2].channels[2]: memory channel to rank 3 has no pair: this rank has 1 memory channels to rank 3, "
     "rank 3 has 0 back (rank 2)"),
    (lambda d: d["ranks"][1]["channels"][0].update(peer=1),
     "ranks[1].channels[0].peer: peer 1 is this rank itself (rank 1)"),
    (lambda d: ops_of(d, 3)[1].update(op="jump"),
     "ranks[3].thread_blocks[0].ops[1].op: unknown value 'jump' (expected one of put, get, signal, wait, flush, "
     "copy, reduce, put_packets, unpack_packets, reduce_packets, read_reduce_copy_send, barrier) (rank 3)"),
    (lambda d: ops_of(d, 3)[1].update(src=ref("input", 0)),
     "ranks[3].thread_blocks[0].ops[1].src: unknown field (rank 3)"),
    (lambda d: ops_of(d, 3)[0].pop("dst"), "ranks[3].thread_blocks[0].ops[0].dst: missing field (rank 3)"),
    (lambda d: ops_of(d, 0)[1].update(op="flush"),
     "ranks[0].thread_blocks[0].ops[1].channel: channel 0 is a memory channel; this needs port (rank 0)"),
    (lambda d: d["ranks"][2]["thread_blocks"][0].update(id=1),
     "ranks[2].thread_blocks[0].id: is 1, expected its position 0 (rank 2)"),
    (lambda d: d.update(version=2), "version: version 2 is not supported (this loader reads 1)"),
    (lambda d: d.update(inplace=1), "inplace: expected a boolean, found an integer"),
    (lambda d: d.update(world_size=3), "ranks: has 4 entries, world_size is 3"),
    (lambda d: d["chunks"].update(output=2), "chunks.output: allreduce needs as many output chunks as input (1), found 2"),
    (lambda d: d.update(root=0), "root: only broadcast has a root, not allreduce"),
    (lambda d: d.update(extra=0), "extra: unknown field"),
    (lambda d: d.update(max_bytes=-1), "max_bytes: -1 is below the minimum 0"),
])
def test_malformed_plans_name_the_field_and_rank(edit, message):
    assert str(rejected(mutated(allreduce_allpairs(4), edit))) == message


def test_packet_ops_address_scratch():
    doc = mutated(allreduce_packets(2), lambda d: ops_of(d, 0)[0]["dst"].update(buffer="output"))
    assert str(rejected(doc)) == ("ranks[0].thread_blocks[0].ops[0].dst.buffer: unknown value 'output' "
                                  "(expected one of scratch) (rank 0)")


def test_error_carries_its_location():
    e = rejected(mutated(allreduce_allpairs(4), lambda d: ops_of(d, 2)[-1]["srcs"][1].update(index=6)))
    assert (e.kind, e.rank, e.thread_block, e.op_index) == ("out_of_range", 2, 0, 9)


def test_files_that_are_not_json_are_plan_errors(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{")
    assert "not valid JSON" in str(rejected(str(path)))
    assert "cannot read" in str(rejected(str(tmp_path / "missing.json")))


def test_broadcast_needs_a_root():
    doc = plan_doc("broadcast", 2, (1, 1, 0), allgather(2)["ranks"])
    assert str(rejected(doc)) == "root: missing field (required for broadcast)"


# -- fuzzing ------------------------------------------------------------------------------------------

ODD_VALUES = [None, True, False, 0, 1, -1, 2, 3, 7, 1 << 40, 1.5, "", "input", "scratch", "memory", "port",
              "put", "wait", "barrier", [], [1], {}, {"buffer": "input", "index": 0, "count": 1}]


def _containers(doc, path=()):
    yield path, doc
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from _containers(value, path + (key,))


def _mutate(doc: dict, rng: random.Random) -> dict:
    d = copy.deepcopy(doc)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        nodes = [(p, v) for p, v in _containers(d) if isinstance(v, (dict, list)) and v]
        path, node = rng.choice(nodes)
        key = rng.choice(list(node.keys()) if isinstance(node, dict) else range(len(node)))
        action = rng.random()
        if action < 0.2:
            del node[key]
        elif action < 0.3 and isinstance(node, list):
            node.insert(key, copy.deepcopy(node[rng.randrange(len(node))]))
        elif action < 0.4 and isinstance(node, dict):
            node["x" + str(rng.randint(0, 9))] = rng.choice(ODD_VALUES)
        elif action < 0.6 and isinstance(node[key], int) and not isinstance(node[key], bool):
            node[key] += rng.choice([-2, -1, 1, 2])
        else:
            node[key] = copy.deepcopy(rng.choice(ODD_VALUES))
    return d


def test_fuzzed_plans_load_or_raise_plan_error():
    rng = random.Random(1234)
    outcomes = {"plan": 0, "error": 0}
    for i in range(1500):
        doc = _mutate(VALID[i % len(VALID)], rng)
        try:
            plan = load_plan(doc)
        except PlanError as e:
            assert str(e).split(":")[0], doc  # names a path
            outcomes["error"] += 1
            continue
        outcomes["plan"] += 1
        assert load_plan(dump_plan(plan)) == plan
        verify(plan)  # a loaded plan never crashes the verifier
    assert outcomes["plan"] > 30 and outcomes["error"] > 500, outcomes


def test_verifier_handles_reordered_ops():
    """Deleting, duplicating and moving ops keeps plans loadable; the verifier must always answer."""
    rng = random.Random(99)
    found_kinds = set()
    for i in range(400):
        d = copy.deepcopy(VALID[i % len(VALID)])
        ops = ops_of(d, rng.randrange(d["world_size"]), 0)
        k = rng.randrange(len(ops))
        action = rng.choice(["delete", "duplicate", "move"])
        op = ops.pop(k) if action != "duplicate" else copy.deepcopy(ops[k])
        if action != "delete":
            ops.insert(rng.randrange(len(ops) + 1), op)
        found_kinds |= {f.kind for f in verify(load_plan(d))}
    assert {"deadlock", "race", "wrong_result", "unmatched_signal"} <= found_kinds


def test_an_op_whose_source_and_destination_overlap_at_an_offset_is_refused():
    """A copy of scratch[1, 4) to scratch[0, 3) is one parallel copy on the GPU: a race that the
    verifier's chunk-level model cannot see, so the loader (C++ and Python alike) refuses it."""
    shifted = lambda d: ops_of(d, 0).append({"op": "copy", "src": ref("scratch", 1, 3), "dst": ref("scratch", 0, 3)})
    assert str(rejected(mutated(allreduce_allpairs(4), shifted))) == (
        "ranks[0].thread_blocks[0].ops[10]: a source scratch[1, 4) and the destination scratch[0, 3) overlap "
        "without being the same chunks; the op's threads would read chunks others write (a race): use disjoint "
        "chunks, or the very same ones to work in place (rank 0)")
    reduce = lambda d: ops_of(d, 0).append(
        {"op": "reduce", "srcs": [ref("scratch", 0, 2), ref("scratch", 2, 2)], "dst": ref("scratch", 1, 2)})
    assert "overlap without being the same chunks" in str(rejected(mutated(allreduce_allpairs(4), reduce)))
    # The very same chunks (in place) and disjoint ones are fine.
    for src, dst in ((ref("scratch", 0, 2), ref("scratch", 0, 2)), (ref("scratch", 0, 2), ref("scratch", 2, 2))):
        ok = mutated(allreduce_allpairs(4), lambda d: ops_of(d, 0).append({"op": "copy", "src": src, "dst": dst}))
        load_plan(ok)


def test_files_that_are_not_plans_fail_fast(tmp_path):
    """No wait on a FIFO, no endless read of a device: both loaders look before they read."""
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero", tmp_path):
        with pytest.raises(PlanError) as info:
            load_plan(path)
        assert str(info.value).endswith("not a regular file"), str(info.value)


def test_integers_beyond_64_bits_are_refused_as_the_cpp_loader_does():
    huge = mutated(allreduce_allpairs(4), lambda d: d.update(max_bytes=1 << 63))
    assert str(rejected(huge)) == f"max_bytes: {1 << 63} is too large (this loader reads 64-bit integers)"
