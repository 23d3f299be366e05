"""AllGather through port channels: allgather_allpairs with each put made by the host proxy on the
copy engine (the SMs only ask for it); a signal on a port channel follows the put's landing."""

from ferry.dsl import CollectiveProgram, PortChannel
from ferry.programs.allgather_allpairs import program as allpairs


def program(world_size: int) -> CollectiveProgram:
    return allpairs(world_size, name="allgather_port", channel=PortChannel)
