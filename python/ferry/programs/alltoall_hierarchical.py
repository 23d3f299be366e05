"""AllToAll for ranks on several hosts, in two phases, each on the channels of its links:

1. on each host, every rank hands each peer, over memory channels (NVLink), its chunks bound for
   that peer's local index on every host (the peer's scratch);
2. across hosts, every rank sends each other host's rank of its local index the L chunks its host
   holds for that rank (its own and its host peers'), over port channels (the host proxy: the copy
   engine within a host, the network between hosts), straight into the output.

So the traffic between two hosts goes as L transfers of L chunks each, one per local index,
instead of L * L transfers of one chunk: fewer, larger messages on the network. Rank r is local rank
``r % L`` of host ``r // L`` (``L = ranks_per_host``; by default two hosts, ferry/programs/_hosts.py).
Input chunk c of a rank is bound for rank c, and output chunk s holds rank s's chunk. Scratch:
``slot(sender local, receiver local) * H + g`` holds the on-host peer's chunk bound for (host g, my
local index). On one host the same plan runs with its port channels on the copy engine
(docs/multi-node.md).
"""

from ferry.dsl import CollectiveProgram
from ferry.programs._hosts import even_layout, memory_channels, port_channels
from ferry.programs.reducescatter_allpairs import slot


def program(world_size: int, *, ranks_per_host: int | None = None, host_sizes: list[int] | None = None,
            name: str = "alltoall_hierarchical") -> CollectiveProgram:
    w = world_size
    hosts = even_layout(w, ranks_per_host, host_sizes=host_sizes, program=name)
    L, H, host, local = hosts.per_host, hosts.hosts, hosts.host, hosts.local
    with CollectiveProgram(name, "alltoall", world_size=w, input_chunks=w,
                           scratch_chunks=(L - 1) * H) as prog:
        on_host, across = hosts.on_host, hosts.across
        memory, port = memory_channels(hosts), port_channels(hosts)
        for r in range(w):
            me, h, l = prog.rank(r), host(r), local(r)
            # 1. On the host: each peer gets my chunks bound for its local index on every host; the
            # ones bound for its own host go straight to its output.
            for p in on_host(r):
                k = local(p)
                for g in range(H):
                    dst = prog.rank(p).output[r] if g == h else prog.rank(p).scratch[slot(l, k) * H + g]
                    memory[r, p].put(me.input[hosts.rank(g, k)], dst, tb=0)
                memory[r, p].signal(tb=0)
            me.copy(me.input[r], me.output[r], tb=0)
            for p in on_host(r):
                memory[p, r].pair.wait(tb=0)
            # 2. Across hosts: to my local index's rank on host g, the chunks of every rank of my host
            # bound for it (mine from my input, my peers' from my scratch), into its output.
            for p in across(r):
                g = host(p)
                for k in range(L):
                    sender = hosts.rank(h, k)
                    src = me.input[p] if k == l else me.scratch[slot(k, l) * H + g]
                    port[r, p].put(src, prog.rank(p).output[sender], tb=0)
                port[r, p].signal(tb=0)
            for p in across(r):
                port[p, r].pair.wait(tb=0)
    return prog
