"""Broadcast for ranks on several hosts, in three phases, each on the channels of its links. The
root's buffer is cut into one chunk per rank of the root's host, chunk k for its local rank k:

1. on the root's host, the root puts chunk k into the output of its host's rank of local index k,
   over memory channels (NVLink);
2. across hosts, the rank of local index k on the root's host puts chunk k into the output of its
   partner on every other host (the rank of local index k, ferry/programs/_hosts.py), over port
   channels (the host proxy: the copy engine within a host, the network between hosts);
3. on each host, every rank puts the chunks it holds into the outputs of its host peers, over
   memory channels (on the root's host, not into the root's, which has every chunk).

So each byte leaves the root's host once per other host, and the ranks of the root's host share
that traffic. The hosts hold ``ranks_per_host`` consecutive ranks each (by default two hosts), or
``host_sizes`` ranks, which may differ: a host smaller than the root's has ranks that receive
several chunks, a larger one ranks that receive none and only wait. On one host its port channels run
as memory channels unless FERRY_PLAN_PORTS=proxy (docs/executor.md).
"""

from ferry.dsl import CollectiveProgram, PortChannel
from ferry.programs._hosts import layout, memory_channels


def program(world_size: int, *, ranks_per_host: int | None = None, host_sizes: list[int] | None = None,
            root: int = 0, name: str = "broadcast_hierarchical") -> CollectiveProgram:
    w = world_size
    hosts = layout(w, ranks_per_host, host_sizes=host_sizes, program=name)
    host, local = hosts.host, hosts.local
    h0 = host(root)
    chunks = hosts.sizes[h0]
    owner = [hosts.rank(h0, k) for k in range(chunks)]

    def held(r: int) -> list[int]:
        """The chunks r holds after phase 2."""
        if host(r) == h0:
            return [local(r)]
        return [k for k in range(chunks) if hosts.partner(owner[k], host(r)) == r]

    with CollectiveProgram(name, "broadcast", world_size=w, input_chunks=chunks, root=root) as prog:
        on_host = hosts.on_host
        memory = memory_channels(hosts)
        port = {(owner[k], hosts.partner(owner[k], g)): PortChannel(owner[k], hosts.partner(owner[k], g))
                for k in range(chunks) for g in range(hosts.hosts) if g != h0}
        top = prog.rank(root)
        # 1. On the root's host: chunk k to local rank k.
        for k in range(chunks):
            top.copy(top.input[k], top.output[k], tb=0)
        for p in on_host(root):
            memory[root, p].put(top.input[local(p)], prog.rank(p).output[local(p)], tb=0)
            memory[root, p].signal(tb=0)
        for p in on_host(root):
            memory[root, p].pair.wait(tb=0)
        for r in range(w):
            me, mine = prog.rank(r), held(r)
            # 2. Across hosts: from the root's host, chunk k to its owner's partner on every other host.
            if host(r) == h0:
                for (src, dst), ch in port.items():
                    if src == r:
                        ch.put(me.output[local(r)], prog.rank(dst).output[local(r)], tb=0)
                        ch.signal(tb=0)
            else:
                for k in mine:
                    port[owner[k], r].pair.wait(tb=0)
            # 3. On the host: my chunks to every peer (on the root's host, the root has them all).
            if mine:
                for p in on_host(r):
                    if p == root:
                        continue
                    for k in mine:
                        memory[r, p].put(me.output[k], prog.rank(p).output[k], tb=0)
                    memory[r, p].signal(tb=0)
            if r != root:
                for p in on_host(r):
                    if held(p):
                        memory[p, r].pair.wait(tb=0)
    return prog
