"""AllGather for ranks on several hosts, in two phases, each on the channels of its links:

1. across hosts, every rank puts its input into the output of its partner on every other host
   (the rank of its local index), over port channels (the host proxy: the copy engine within a
   host, the network between hosts); so each input leaves its host once per other host;
2. on each host, every rank puts the chunks it now holds (its own and those its partners sent it)
   into the output of every other rank of its host, over memory channels (NVLink).

The hosts hold ``ranks_per_host`` consecutive ranks each (by default two hosts), or ``host_sizes``
ranks, which may differ (3 + 1): then a rank of a smaller host is the partner of several ranks of
a larger one and forwards all their chunks (ferry/programs/_hosts.py). Every port channel carries
one signal, every memory channel one, after the rank has waited for the chunks it forwards. On one
host its port channels run as memory channels unless FERRY_PLAN_PORTS=proxy (docs/executor.md).
"""

from ferry.dsl import CollectiveProgram
from ferry.programs._hosts import Hosts, layout, memory_channels, port_channels


def program(world_size: int, *, ranks_per_host: int | None = None, host_sizes: list[int] | None = None,
            name: str = "allgather_hierarchical") -> CollectiveProgram:
    w = world_size
    hosts = layout(w, ranks_per_host, host_sizes=host_sizes, program=name)
    with CollectiveProgram(name, "allgather", world_size=w, input_chunks=1) as prog:
        for r in range(w):
            prog.rank(r).copy(prog.rank(r).input[0], prog.rank(r).output[r], tb=0)
        gather_through_partners(prog, hosts, memory_channels(hosts), port_channels(hosts),
                                lambda r: prog.rank(r).input[0])
    return prog


def gather_through_partners(prog: CollectiveProgram, hosts: Hosts, memory, port, source) -> None:
    """Rank r's chunk ``source(r)`` (already in its ``output[r]``) into ``output[r]`` of every
    rank: to r's partner on every other host (port channels), then from each rank to its host
    peers, with the chunks its partners sent it (memory channels)."""
    on_host, sends_to, receives_from = hosts.on_host, hosts.sends_to, hosts.receives_from
    for r in range(hosts.world_size):
        me = prog.rank(r)
        # 1. Across hosts: my chunk to my partner on every other host.
        for p in sends_to(r):
            port[r, p].put(source(r), prog.rank(p).output[r], tb=0)
            port[r, p].signal(tb=0)
        for p in receives_from(r):
            port[p, r].pair.wait(tb=0)
        # 2. On the host: the chunks I hold (mine and my partners') to every peer.
        for p in on_host(r):
            for c in [r] + receives_from(r):
                memory[r, p].put(me.output[c], prog.rank(p).output[c], tb=0)
            memory[r, p].signal(tb=0)
        for p in on_host(r):
            memory[p, r].pair.wait(tb=0)
