"""The shipped collective programs. Each module defines ``program(world_size) -> CollectiveProgram``
and compiles with ``python -m ferry.dsl compile ferry/programs/NAME.py --ranks N``.
``PROGRAMS`` names them all."""

from pathlib import Path

PROGRAMS = ("allreduce_allpairs_packets", "allreduce_two_shot", "allreduce_ring", "allgather_allpairs",
            "allgather_port", "reducescatter_allpairs", "alltoall_allpairs")


def path_of(name: str) -> Path:
    """The program file of shipped program ``name``."""
    return Path(__file__).with_name(f"{name}.py")
