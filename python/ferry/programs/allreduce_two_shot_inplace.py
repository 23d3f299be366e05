"""AllReduce in two shots, in place (send == recv): allreduce_two_shot's ops on one buffer."""

from ferry.dsl import CollectiveProgram
from ferry.programs.allreduce_two_shot import program as two_shot


def program(world_size: int) -> CollectiveProgram:
    return two_shot(world_size, name="allreduce_two_shot_inplace", inplace=True)
