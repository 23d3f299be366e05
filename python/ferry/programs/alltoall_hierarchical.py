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
local index). On one host its port channels run as memory channels unless
FERRY_PLAN_PORTS=proxy (docs/executor.md).

Hosts of different sizes (``host_sizes``, 3 + 1) have no common local index to gather by; there
each rank sends its partner on every other host (ferry/programs/_hosts.py) its chunks bound for
that host, one transfer per host (``uneven_program``), and the partner hands them on over memory
channels.
"""

from ferry.dsl import CollectiveProgram
from ferry.programs._hosts import Hosts, layout, memory_channels, port_channels
from ferry.programs.reducescatter_allpairs import slot


def program(world_size: int, *, ranks_per_host: int | None = None, host_sizes: list[int] | None = None,
            name: str = "alltoall_hierarchical") -> CollectiveProgram:
    w = world_size
    hosts = layout(w, ranks_per_host, host_sizes=host_sizes, program=name)
    if not hosts.is_even:
        return uneven_program(hosts, name)
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


def uneven_program(hosts: Hosts, name: str) -> CollectiveProgram:
    """AllToAll on hosts of different sizes: r puts its chunks bound for host g into its partner
    there (the one bound for the partner itself straight into its output, the others into its
    scratch, in the slot of (r, destination)), then every rank hands the chunks it received on to
    their destinations on its host, beside its own chunks for them, over memory channels."""
    w = hosts.world_size
    host, local, on_host = hosts.host, hosts.local, hosts.on_host
    senders = {r: hosts.receives_from(r) for r in range(w)}
    per_rank = max(len(senders[r]) * hosts.sizes[host(r)] for r in range(w))

    def parked(r: int, q: int, d: int) -> int:
        """The scratch chunk of r holding sender q's chunk bound for d (on r's host)."""
        return senders[r].index(q) * hosts.sizes[host(r)] + local(d)

    with CollectiveProgram(name, "alltoall", world_size=w, input_chunks=w, scratch_chunks=max(per_rank, 1)) as prog:
        memory, port = memory_channels(hosts), port_channels(hosts)
        for r in range(w):
            me = prog.rank(r)
            me.copy(me.input[r], me.output[r], tb=0)
            # 1. Across hosts: my chunks bound for host g to my partner there.
            for p in hosts.sends_to(r):
                partner = prog.rank(p)
                for k in range(hosts.sizes[host(p)]):
                    d = hosts.rank(host(p), k)
                    dst = partner.output[r] if d == p else partner.scratch[parked(p, r, d)]
                    port[r, p].put(me.input[d], dst, tb=0)
                port[r, p].signal(tb=0)
            for q in senders[r]:
                port[q, r].pair.wait(tb=0)
            # 2. On the host: to each peer, my chunk for it and those I received for it.
            for p in on_host(r):
                memory[r, p].put(me.input[p], prog.rank(p).output[r], tb=0)
                for q in senders[r]:
                    memory[r, p].put(me.scratch[parked(r, q, p)], prog.rank(p).output[q], tb=0)
                memory[r, p].signal(tb=0)
            for p in on_host(r):
                memory[p, r].pair.wait(tb=0)
    return prog
