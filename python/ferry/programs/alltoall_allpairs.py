"""AllToAll, all pairs: rank r puts input chunk p into rank p's output chunk r, one thread block per
peer, and copies its own chunk locally while the first put is on its way; a signal/wait per pair
marks arrival."""

from ferry.dsl import CollectiveProgram, MemoryChannel


def program(world_size: int) -> CollectiveProgram:
    w = world_size
    with CollectiveProgram("alltoall_allpairs", "alltoall", world_size=w, input_chunks=w) as prog:
        ch = {(r, p): MemoryChannel(r, p) for r in range(w) for p in range(w) if r != p}
        for r in range(w):
            me = prog.rank(r)
            for tb, p in enumerate(p for p in range(w) if p != r):
                ch[r, p].put(me.input[p], prog.rank(p).output[r], tb=tb)
                ch[r, p].signal(tb=tb)
                if tb == 0:  # the own chunk while the put is on its way, not ahead of it
                    me.copy(me.input[r], me.output[r], tb=0)
                ch[p, r].pair.wait(tb=tb)
    return prog
