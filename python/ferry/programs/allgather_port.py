"""AllGather through port channels: allgather_allpairs with each put made by the host proxy on the
copy engine (the SMs only ask for it); a signal on a port channel follows the put's landing. That is
with FERRY_PLAN_PORTS=proxy; by default, on one host, a port channel runs as a memory channel
(docs/executor.md), and this plan as allgather_allpairs does.

The rank's own copy runs on 8 thread blocks of its own: plans with port channels run in one lane,
so on thread block 0 one CUDA block copied a quarter of the output (at 4 ranks) before its put
could start. On 4 H200 the plan then took 3.4 times the copy-engine allgather's time at 1 GiB, an
extra time that matches one block copying at about 50 GB/s."""

from ferry.dsl import CollectiveProgram, PortChannel
from ferry.programs.allgather_allpairs import program as allpairs


def program(world_size: int) -> CollectiveProgram:
    return allpairs(world_size, name="allgather_port", channel=PortChannel, copy_blocks=8)
