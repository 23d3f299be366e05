"""AllGather, all pairs, in place (send == recv + rank * count): allgather_allpairs without the
copy of the input into the rank's own slot, which already holds it."""

from ferry.dsl import CollectiveProgram
from ferry.programs.allgather_allpairs import program as allpairs


def program(world_size: int) -> CollectiveProgram:
    return allpairs(world_size, name="allgather_allpairs_inplace", inplace=True)
