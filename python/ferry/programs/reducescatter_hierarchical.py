"""ReduceScatter for ranks on several hosts, in two phases, each on the channels of its links:

1. on each host, a reduce-scatter over memory channels (NVLink) by local index: the rank of local
   index l sums, over its host, the chunks bound for the ranks of local index l on every host;
2. across hosts, each rank puts those host sums to their ranks of its local index on the other
   hosts, over port channels (the host proxy: the copy engine within a host, the network between
   hosts), and sums the host sums of its own chunk, in host order.

So each byte leaves its host once, as a host's sum, and the ranks of a host share the cross-host
traffic. Rank r is local rank ``r % L`` of host ``r // L`` (``L = ranks_per_host``; by default two
hosts, ferry/programs/_hosts.py); input chunk ``g * L + k`` is bound for rank (host g, local k).
Scratch: (L - 1) * H slots for the on-host peers' chunks (``slot(sender local, receiver local) * H
+ g``), then H slots for this rank's host sums (``P + g``, P = (L - 1) * H), then H - 1 for the other
hosts' sums of this rank's chunk (``P + H + slot(sender host, receiver host)``). The sums run in
local rank order, then in host order. On one host the same plan runs with its port channels on the
copy engine (docs/multi-node.md).
"""

from ferry.dsl import CollectiveProgram
from ferry.programs._hosts import even_layout, memory_channels, port_channels
from ferry.programs.reducescatter_allpairs import slot


def program(world_size: int, *, ranks_per_host: int | None = None, host_sizes: list[int] | None = None,
            name: str = "reducescatter_hierarchical") -> CollectiveProgram:
    w = world_size
    hosts = even_layout(w, ranks_per_host, host_sizes=host_sizes, program=name)
    L, H, host, local = hosts.per_host, hosts.hosts, hosts.host, hosts.local
    P = (L - 1) * H
    with CollectiveProgram(name, "reducescatter", world_size=w, input_chunks=w,
                           scratch_chunks=P + H + (H - 1)) as prog:
        on_host, across = hosts.on_host, hosts.across
        memory, port = memory_channels(hosts), port_channels(hosts)
        for r in range(w):
            me, h, l = prog.rank(r), host(r), local(r)
            # 1. On the host: each peer's chunks (its local index, every host) to its scratch; then
            # my host's sums of the chunks of my local index.
            for p in on_host(r):
                k = local(p)
                for g in range(H):
                    memory[r, p].put(me.input[g * L + k], prog.rank(p).scratch[slot(l, k) * H + g], tb=0)
                memory[r, p].signal(tb=0)
            for p in on_host(r):
                memory[p, r].pair.wait(tb=0)

            def host_sum(g):
                """This host's sum of the chunk bound for (host g, local l)."""
                return me.scratch[P + g] if L > 1 else me.input[g * L + l]

            if L > 1:
                for g in range(H):
                    me.reduce([me.input[g * L + l] if k == l else me.scratch[slot(k, l) * H + g] for k in range(L)],
                              me.scratch[P + g], tb=0)
            # 2. Across hosts: each host sum to its rank; then the sum over hosts of my chunk.
            for p in across(r):
                g = host(p)
                port[r, p].put(host_sum(g), prog.rank(p).scratch[P + H + slot(h, g)], tb=0)
                port[r, p].signal(tb=0)
            for p in across(r):
                port[p, r].pair.wait(tb=0)
            parts = [host_sum(h) if g == h else me.scratch[P + H + slot(g, h)] for g in range(H)]
            if len(parts) > 1:
                me.reduce(parts, me.output[0], tb=0)
            else:
                me.copy(parts[0], me.output[0], tb=0)
    return prog
