"""AllGather for ranks on several hosts, in two phases, each on the channels of its links:

1. across hosts, every rank puts its input into the output of the rank of its local index on every
   other host, over port channels (the host proxy: the copy engine within a host, the network
   between hosts); so each input leaves its host once per other host;
2. on each host, every rank puts the H chunks it now holds (those of its local index, one per host)
   into the output of every other rank of its host, over memory channels (NVLink).

Rank r is local rank ``r % L`` of host ``r // L`` (``L = ranks_per_host``; by default two hosts,
ferry/programs/_hosts.py). Every port channel carries one signal, every memory channel one, after
the rank has waited for the chunks it forwards. On one host the same plan runs with its port
channels on the copy engine (docs/multi-node.md).
"""

from ferry.dsl import CollectiveProgram
from ferry.programs._hosts import layout, memory_channels, port_channels


def program(world_size: int, *, ranks_per_host: int | None = None,
            name: str = "allgather_hierarchical") -> CollectiveProgram:
    w = world_size
    hosts = layout(w, ranks_per_host, program=name)
    with CollectiveProgram(name, "allgather", world_size=w, input_chunks=1) as prog:
        on_host, across = hosts.on_host, hosts.across
        memory, port = memory_channels(hosts), port_channels(hosts)
        for r in range(w):
            me = prog.rank(r)
            # 1. Across hosts: my input to my local index's rank on every other host.
            me.copy(me.input[0], me.output[r], tb=0)
            for p in across(r):
                port[r, p].put(me.input[0], prog.rank(p).output[r], tb=0)
                port[r, p].signal(tb=0)
            for p in across(r):
                port[p, r].pair.wait(tb=0)
            # 2. On the host: the chunks of my local index (mine and the other hosts') to every peer.
            mine = [r] + across(r)
            for p in on_host(r):
                for c in mine:
                    memory[r, p].put(me.output[c], prog.rank(p).output[c], tb=0)
                memory[r, p].signal(tb=0)
            for p in on_host(r):
                memory[p, r].pair.wait(tb=0)
    return prog
