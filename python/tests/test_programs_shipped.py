"""Every shipped program, compiled for 2, 4 and 8 ranks, passes the plan loader and the verifier;
a planted fault in a shipped plan is caught (so a clean result means something)."""

import re
from pathlib import Path

import pytest

from ferry.dsl.cli import load_program
from ferry.plan.load import load_plan
from ferry.plan.verify import verify
from ferry.programs import PROGRAM_GLOB, PROGRAMS, discover, path_of

CMAKE_LISTS = Path(__file__).resolve().parents[2] / "tests" / "unit" / "CMakeLists.txt"


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("name", PROGRAMS)
def test_program_verifies_clean(name, world_size):
    plan = load_program(str(path_of(name)), world_size).to_plan()
    assert plan["name"] == name and plan["world_size"] == world_size
    findings = verify(load_plan(plan))
    assert findings == [], "\n".join(map(str, findings))


@pytest.mark.parametrize("name", ["allreduce_ring", "allreduce_two_shot", "reducescatter_allpairs"])
def test_dropping_a_wait_is_caught(name):
    plan = load_program(str(path_of(name)), 4).to_plan()
    ops = plan["ranks"][2]["thread_blocks"][0]["ops"]
    ops.pop(next(i for i, o in enumerate(ops) if o["op"] == "wait"))
    findings = verify(load_plan(plan))
    assert any(f.rank == 2 for f in findings)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("instances,pipeline", [(1, 1), (1, 3), (3, 2)])
def test_ring_with_instances_and_pipeline_verifies_clean(world_size, instances, pipeline):
    from ferry.programs.allreduce_ring import program
    plan = program(world_size, instances=instances, pipeline=pipeline).to_plan()
    assert plan["chunks"]["input"] == world_size * instances * pipeline
    assert len(plan["ranks"][0]["thread_blocks"]) == instances
    findings = verify(load_plan(plan))
    assert findings == [], "\n".join(map(str, findings))


def test_pipelined_plan_with_a_dropped_wait_is_caught():
    from ferry.programs.allreduce_ring import program
    plan = program(4, instances=1, pipeline=2).to_plan()
    ops = plan["ranks"][1]["thread_blocks"][0]["ops"]
    waits = [i for i, o in enumerate(ops) if o["op"] == "wait"]
    ops.pop(waits[len(waits) // 2])   # the first wait of stage 1
    assert any(f.rank == 1 for f in verify(load_plan(plan)))


def test_programs_are_discovered_from_the_directory(tmp_path):
    for name in ("new_collective.py", "_helper.py", "__init__.py", "notes.txt", "Upper.py"):
        (tmp_path / name).write_text("")
    assert discover(tmp_path) == ("new_collective",)
    assert {"allgather_port", "allreduce_ring", "alltoall_allpairs"} <= set(PROGRAMS)


def test_programs_match_the_files_the_cpp_cross_check_compiles():
    """The C++ side compiles what its glob finds; pytest must verify the same set, or a program could
    run on GPUs unverified."""
    if not CMAKE_LISTS.exists():
        pytest.skip("not a source checkout")
    found = re.search(r"file\(GLOB programs \$\{PROJECT_SOURCE_DIR\}/python/ferry/programs/(\S+)\)",
                      CMAKE_LISTS.read_text())
    assert found, f"{CMAKE_LISTS} no longer globs python/ferry/programs: update ferry.programs.PROGRAM_GLOB"
    assert found.group(1) == PROGRAM_GLOB


HIERARCHICAL = ("allreduce_hierarchical", "allgather_hierarchical", "reducescatter_hierarchical",
                "alltoall_hierarchical", "broadcast_hierarchical")


def _hierarchical(name, world_size, ranks_per_host):
    import importlib
    module = importlib.import_module(f"ferry.programs.{name}")
    return module.program(world_size, ranks_per_host=ranks_per_host).to_plan()


@pytest.mark.parametrize("name", HIERARCHICAL)
@pytest.mark.parametrize("world_size,ranks_per_host", [(2, 1), (4, 2), (6, 3), (8, 4), (3, 1), (6, 2), (4, 1), (8, 2)])
def test_hierarchical_programs_verify_for_every_host_layout(name, world_size, ranks_per_host):
    plan = _hierarchical(name, world_size, ranks_per_host)
    findings = verify(load_plan(plan))
    assert findings == [], "\n".join(map(str, findings))
    kinds = {ch["type"] for rank in plan["ranks"] for ch in rank.get("channels", [])}
    assert "port" in kinds and (ranks_per_host == 1 or "memory" in kinds), kinds


@pytest.mark.parametrize("name,op,which", [("allreduce_hierarchical", "reduce", 1),  # the sum over hosts
                                           ("reducescatter_hierarchical", "reduce", -1),
                                           ("allgather_hierarchical", "wait", 0),  # a cross-host arrival
                                           ("alltoall_hierarchical", "wait", 0),  # an on-host arrival
                                           ("broadcast_hierarchical", "wait", 0)])
def test_hierarchical_programs_with_a_step_dropped_are_caught(name, op, which):
    plan = _hierarchical(name, 8, 4)
    ops = plan["ranks"][5]["thread_blocks"][0]["ops"]
    ops.pop([i for i, o in enumerate(ops) if o["op"] == op][which])
    found = verify(load_plan(plan))
    assert any(f.rank in (4, 5) and ("wrong_result" in str(f) or "race" in str(f)) for f in found), found


def test_hierarchical_programs_refuse_hosts_that_do_not_divide_the_ranks():
    from ferry.programs._hosts import Hosts, layout
    assert layout(8) == Hosts.even(4, 2) and layout(3) == Hosts.even(1, 3) and layout(6, 3) == Hosts.even(3, 2)
    assert layout(4, host_sizes=[3, 1]) == Hosts((3, 1))
    with pytest.raises(ValueError, match="do not split"):
        layout(6, 4)
    with pytest.raises(ValueError, match=r"hosts of \[3, 2\] ranks do not make 4 ranks"):
        layout(4, host_sizes=[3, 2])
    with pytest.raises(ValueError, match="not both"):
        layout(4, 2, host_sizes=[2, 2])


def test_partners_across_hosts_of_different_sizes():
    from ferry.programs._hosts import Hosts
    hosts = Hosts((3, 1))  # ranks 0, 1, 2 on host 0; rank 3 on host 1
    assert [hosts.sends_to(r) for r in range(4)] == [[3], [3], [3], [0]]
    assert [hosts.receives_from(r) for r in range(4)] == [[3], [], [], [0, 1, 2]]
    assert hosts.on_host(1) == [0, 2] and hosts.on_host(3) == []
    even = Hosts.even(2, 3)
    assert all(even.sends_to(r) == even.receives_from(r) == even.across(r) for r in range(6))
    with pytest.raises(ValueError, match="hosts of one size, not 3\\+1"):
        hosts.across(0)
    with pytest.raises(ValueError, match="hosts of one size"):
        hosts.per_host  # noqa: B018


UNEVEN = [[3, 1], [1, 3], [2, 1, 3], [3, 2], [4, 1, 1], [1, 2]]


@pytest.mark.parametrize("sizes", UNEVEN)
@pytest.mark.parametrize("name", HIERARCHICAL)
def test_hierarchical_programs_verify_for_hosts_of_different_sizes(name, sizes):
    import importlib
    module = importlib.import_module(f"ferry.programs.{name}")
    findings = verify(load_plan(module.program(sum(sizes), host_sizes=sizes).to_plan()))
    assert findings == [], "\n".join(map(str, findings))


@pytest.mark.parametrize("sizes", UNEVEN)
def test_hierarchical_broadcast_verifies_for_hosts_of_different_sizes_from_every_root(sizes):
    from ferry.programs.broadcast_hierarchical import program
    for root in range(sum(sizes)):
        findings = verify(load_plan(program(sum(sizes), host_sizes=sizes, root=root).to_plan()))
        assert findings == [], f"root {root}:\n" + "\n".join(map(str, findings))


def test_a_rank_that_forwards_several_hosts_chunks_is_checked():
    # 3 + 2: rank 3 is the partner of ranks 0 and 2, and forwards both chunks to rank 4; without
    # its wait for rank 2's, it forwards what is not there yet.
    from ferry.programs.allgather_hierarchical import program
    plan = program(5, host_sizes=[3, 2]).to_plan()
    ops = plan["ranks"][3]["thread_blocks"][0]["ops"]
    ops.pop([i for i, o in enumerate(ops) if o["op"] == "wait"][1])
    found = verify(load_plan(plan))
    assert any(f.rank in (3, 4) for f in found), found


@pytest.mark.parametrize("name,op", [("reducescatter_hierarchical", "reduce"), ("allreduce_hierarchical", "reduce")])
def test_hierarchical_sums_on_hosts_of_different_sizes_with_a_step_dropped_are_caught(name, op):
    # 3 + 2: rank 3 sums host 1's part of rank 0's chunk (its first reduce); dropping it leaves a
    # chunk unsummed.
    import importlib
    plan = importlib.import_module(f"ferry.programs.{name}").program(5, host_sizes=[3, 2]).to_plan()
    ops = plan["ranks"][3]["thread_blocks"][0]["ops"]
    ops.pop([i for i, o in enumerate(ops) if o["op"] == op][0])
    assert verify(load_plan(plan)), "the dropped sum went unnoticed"


@pytest.mark.parametrize("world_size,ranks_per_host,root", [(8, 4, 5), (6, 3, 4), (4, 2, 3), (6, 2, 3)])
def test_hierarchical_broadcast_verifies_from_any_root(world_size, ranks_per_host, root):
    from ferry.programs.broadcast_hierarchical import program
    findings = verify(load_plan(program(world_size, ranks_per_host=ranks_per_host, root=root).to_plan()))
    assert findings == [], "\n".join(map(str, findings))
