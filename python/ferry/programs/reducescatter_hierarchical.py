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
local rank order, then in host order. On one host its port channels run as memory channels unless
FERRY_PLAN_PORTS=proxy (docs/executor.md).

Hosts of different sizes (``host_sizes``, 3 + 1) have no common local index; there each host's sum
of the chunk bound for rank d is made by d's partner on that host (ferry/programs/_hosts.py) and
put straight to d (``reduce_scatter_uneven``).
"""

from ferry.dsl import CollectiveProgram
from ferry.programs._hosts import Hosts, layout, memory_channels, port_channels
from ferry.programs.reducescatter_allpairs import slot


def program(world_size: int, *, ranks_per_host: int | None = None, host_sizes: list[int] | None = None,
            name: str = "reducescatter_hierarchical") -> CollectiveProgram:
    w = world_size
    hosts = layout(w, ranks_per_host, host_sizes=host_sizes, program=name)
    if not hosts.is_even:
        with CollectiveProgram(name, "reducescatter", world_size=w, input_chunks=w,
                               scratch_chunks=uneven_scratch_chunks(hosts)) as prog:
            reduce_scatter_uneven(prog, hosts, memory_channels(hosts), port_channels(hosts),
                                  lambda r: prog.rank(r).output[0])
        return prog
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


def _uneven_bases(hosts: Hosts, c: int) -> tuple[int, int, int]:
    """Where rank c's scratch regions start on hosts of different sizes: the peers' chunks bound
    for each rank it sums for (n * (S - 1) slots: ``i * (S - 1) + slot(sender local, c's local)``
    for the i-th of them), its host sums of those (n), its peers' chunks bound for itself (S - 1,
    ``slot(sender local, c's local)``), and the other hosts' sums of its chunk (H - 1,
    ``slot(sender host, c's host)``)."""
    n, s = len(hosts.receives_from(c)), hosts.sizes[hosts.host(c)]
    return n * (s - 1), n * (s - 1) + n, n * (s - 1) + n + (s - 1)


def uneven_scratch_chunks(hosts: Hosts) -> int:
    """The scratch chunks reduce_scatter_uneven needs (every rank's program has the same count)."""
    return max(_uneven_bases(hosts, c)[2] + hosts.hosts - 1 for c in range(hosts.world_size))


def reduce_scatter_uneven(prog: CollectiveProgram, hosts: Hosts, memory, port, out) -> None:
    """Input chunk d of every rank, summed over all ranks, into ``out(d)`` of rank d, on hosts of
    different sizes:

    1. on each host, every rank puts to each peer its chunk bound for that peer and its chunks
       bound for the ranks of other hosts whose partner that peer is (memory channels);
    2. each rank sums, in local rank order, its host's contributions to the chunk of every rank it
       is the partner of, and puts that host sum to the rank (port channels);
    3. each rank sums its own chunk: its host's contributions and the other hosts' sums, in host
       order (local rank order within its own host).

    So a host sends each other host's rank one sum, once."""
    host, local, on_host = hosts.host, hosts.local, hosts.on_host
    for r in range(hosts.world_size):
        me, g, size = prog.rank(r), host(r), hosts.sizes[host(r)]
        sums, own, others = _uneven_bases(hosts, r)
        # 1. On the host: to each peer, my chunk for it and my chunks for the ranks it sums for.
        for p in on_host(r):
            peer = prog.rank(p)
            memory[r, p].put(me.input[p], peer.scratch[_uneven_bases(hosts, p)[1] + slot(local(r), local(p))], tb=0)
            for i, d in enumerate(hosts.receives_from(p)):
                memory[r, p].put(me.input[d], peer.scratch[i * (size - 1) + slot(local(r), local(p))], tb=0)
            memory[r, p].signal(tb=0)
        for p in on_host(r):
            memory[p, r].pair.wait(tb=0)
        # 2. Across hosts: my host's sum of each chunk I sum for, to its rank.
        for i, d in enumerate(hosts.receives_from(r)):
            parts = [me.input[d] if k == local(r) else me.scratch[i * (size - 1) + slot(k, local(r))]
                     for k in range(size)]
            if len(parts) > 1:
                me.reduce(parts, me.scratch[sums + i], tb=0)
            total = me.scratch[sums + i] if len(parts) > 1 else me.input[d]
            port[r, d].put(total, prog.rank(d).scratch[_uneven_bases(hosts, d)[2] + slot(g, host(d))], tb=0)
            port[r, d].signal(tb=0)
        for h in range(hosts.hosts):
            if h != g:
                port[hosts.partner(r, h), r].pair.wait(tb=0)
        # 3. My chunk: my host's contributions where my host stands in host order.
        parts = []
        for h in range(hosts.hosts):
            if h == g:
                parts += [me.input[r] if k == local(r) else me.scratch[own + slot(k, local(r))] for k in range(size)]
            else:
                parts.append(me.scratch[others + slot(h, g)])
        if len(parts) > 1:
            me.reduce(parts, out(r), tb=0)
        else:
            me.copy(parts[0], out(r), tb=0)
