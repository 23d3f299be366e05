"""Broadcast for ranks on several hosts, in three phases, each on the channels of its links. The
root's buffer is cut into L chunks, one per local index:

1. on the root's host, the root puts chunk k into the output of its host's rank of local index k,
   over memory channels (NVLink);
2. across hosts, the rank of local index k on the root's host puts chunk k into the output of the
   rank of local index k on every other host, over port channels (the host proxy: the copy engine
   within a host, the network between hosts);
3. on each host, every rank puts its chunk into the outputs of its host peers, over memory channels
   (on the root's host, not into the root's, which has every chunk).

So each byte leaves the root's host once per other host, and the ranks of the root's host share
that traffic. Rank r is local rank ``r % L`` of host ``r // L`` (``L = ranks_per_host``; by default
two hosts, ferry/programs/_hosts.py). On one host the same plan runs with its port channels on the
copy engine (docs/multi-node.md).
"""

from ferry.dsl import CollectiveProgram, PortChannel
from ferry.programs._hosts import layout, memory_channels


def program(world_size: int, *, ranks_per_host: int | None = None, root: int = 0,
            name: str = "broadcast_hierarchical") -> CollectiveProgram:
    w = world_size
    hosts = layout(w, ranks_per_host, program=name)
    L, host, local = hosts.per_host, hosts.host, hosts.local
    h0 = host(root)
    with CollectiveProgram(name, "broadcast", world_size=w, input_chunks=L, root=root) as prog:
        on_host = hosts.on_host
        memory = memory_channels(hosts)
        port = {(hosts.rank(h0, k), hosts.rank(g, k)): PortChannel(hosts.rank(h0, k), hosts.rank(g, k))
                for k in range(L) for g in range(hosts.hosts) if g != h0}
        top = prog.rank(root)
        # 1. On the root's host: chunk k to local rank k.
        for k in range(L):
            top.copy(top.input[k], top.output[k], tb=0)
        for p in on_host(root):
            memory[root, p].put(top.input[local(p)], prog.rank(p).output[local(p)], tb=0)
            memory[root, p].signal(tb=0)
        for p in on_host(root):
            memory[root, p].pair.wait(tb=0)
        for r in range(w):
            me, k = prog.rank(r), local(r)
            # 2. Across hosts: from the root's host, chunk k to local rank k of every other host.
            if host(r) == h0:
                for (src, dst), ch in port.items():
                    if src == r:
                        ch.put(me.output[k], prog.rank(dst).output[k], tb=0)
                        ch.signal(tb=0)
            else:
                port[hosts.rank(h0, k), r].pair.wait(tb=0)
            # 3. On the host: my chunk to every peer (on the root's host, the root has them all).
            receivers = [p for p in on_host(r) if p != root]
            for p in receivers:
                memory[r, p].put(me.output[k], prog.rank(p).output[k], tb=0)
                memory[r, p].signal(tb=0)
            if r != root:
                for p in on_host(r):
                    memory[p, r].pair.wait(tb=0)
    return prog
