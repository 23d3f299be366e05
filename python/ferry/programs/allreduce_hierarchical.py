"""AllReduce for ranks on several hosts, in three phases, each on the channels of its links:

1. on each host, a reduce-scatter over memory channels (NVLink): local rank l ends with its host's
   sum of input chunk l;
2. across hosts, an all-reduce of chunk l among the ranks of local index l, one per host, over port
   channels (the host proxy: the copy engine within a host, the network between hosts): every such
   rank puts its host's sum to the others and adds theirs;
3. on each host, an all-gather of the summed chunks over memory channels.

So each byte leaves a host once per other host, from the one rank that holds that host's sum of it,
and the ranks of a host share the cross-host traffic evenly (docs/multi-node.md).

Rank r is local rank ``r % L`` of host ``r // L`` (``L = ranks_per_host``; by default the shape of
two hosts: world_size / 2 ranks each, or one rank per host for an odd world size). Input chunk l is
what local rank l sums across hosts. Scratch: slots 0 .. L - 2 hold the on-host peers' contributions
(``slot(local sender, local receiver)``, reducescatter_allpairs' layout), slots L - 1 .. L + H - 3
the other hosts' sums (``L - 1 + slot(sender host, receiver host)``). Every memory channel carries
two signals (the phases 1 and 3), every port channel one; the n-th wait consumes the n-th signal.
The sums run in local rank order on a host and in host order across hosts, so every rank computes
the same bits. On one host its port channels run as memory channels unless FERRY_PLAN_PORTS=proxy
(docs/executor.md).

Hosts of different sizes (``host_sizes``, 3 + 1) have no common local index; there the input is cut
into one chunk per rank, rank d's chunk is summed at d as reducescatter_hierarchical does it
(``reduce_scatter_uneven``), and the sums are all-gathered through the partners across hosts
(ferry/programs/_hosts.py), as allgather_hierarchical does.
"""

from ferry.dsl import CollectiveProgram
from ferry.programs._hosts import Hosts, layout, memory_channels, port_channels
from ferry.programs.reducescatter_allpairs import slot
from ferry.programs.allgather_hierarchical import gather_through_partners
from ferry.programs.reducescatter_hierarchical import reduce_scatter_uneven, uneven_scratch_chunks


def program(world_size: int, *, ranks_per_host: int | None = None, host_sizes: list[int] | None = None,
            name: str = "allreduce_hierarchical") -> CollectiveProgram:
    w = world_size
    hosts = layout(w, ranks_per_host, host_sizes=host_sizes, program=name)
    if not hosts.is_even:
        return uneven_program(hosts, name)
    L, H, host, local = hosts.per_host, hosts.hosts, hosts.host, hosts.local
    with CollectiveProgram(name, "allreduce", world_size=w, input_chunks=L,
                           scratch_chunks=(L - 1) + (H - 1)) as prog:
        on_host, across = hosts.on_host, hosts.across
        memory, port = memory_channels(hosts), port_channels(hosts)
        for r in range(w):
            me, l = prog.rank(r), local(r)
            # 1. On the host: every peer's share of my input to it, then my chunk's host sum.
            for p in on_host(r):
                memory[r, p].put(me.input[local(p)], prog.rank(p).scratch[slot(l, local(p))], tb=0)
                memory[r, p].signal(tb=0)
            for p in on_host(r):
                memory[p, r].pair.wait(tb=0)
            if on_host(r):  # in local rank order
                me.reduce([me.input[l] if k == l else me.scratch[slot(k, l)] for k in range(L)], me.output[l], tb=0)
            else:
                me.copy(me.input[l], me.output[l], tb=0)
            # 2. Across hosts: my host's sum of chunk l to the rank of local index l on every other
            # host (a port signal follows its put's landing), then the sum over hosts.
            for p in across(r):
                port[r, p].put(me.output[l], prog.rank(p).scratch[L - 1 + slot(host(r), host(p))], tb=0)
                port[r, p].signal(tb=0)
            for p in across(r):
                port[p, r].pair.wait(tb=0)
            if across(r):  # in host order, the same on every host: every rank rounds alike
                me.reduce([me.output[l] if h == host(r) else me.scratch[L - 1 + slot(h, host(r))] for h in range(H)],
                          me.output[l], tb=0)
            # 3. On the host: the summed chunk to every peer's output.
            for p in on_host(r):
                memory[r, p].put(me.output[l], prog.rank(p).output[l], tb=0)
                memory[r, p].signal(tb=0)
            for p in on_host(r):
                memory[p, r].pair.wait(tb=0)
    return prog


def uneven_program(hosts: Hosts, name: str) -> CollectiveProgram:
    """AllReduce on hosts of different sizes: chunk d summed at rank d, then all-gathered: each
    rank puts its sum to its partner on every other host, and every rank hands the sums it holds to
    its host peers. Each port and memory channel carries a signal per phase that uses it; the n-th
    wait consumes the n-th signal."""
    w = hosts.world_size
    with CollectiveProgram(name, "allreduce", world_size=w, input_chunks=w,
                           scratch_chunks=uneven_scratch_chunks(hosts)) as prog:
        memory, port = memory_channels(hosts), port_channels(hosts)
        reduce_scatter_uneven(prog, hosts, memory, port, lambda r: prog.rank(r).output[r])
        gather_through_partners(prog, hosts, memory, port, lambda r: prog.rank(r).output[r])
    return prog
