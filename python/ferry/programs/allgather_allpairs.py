"""AllGather, all pairs: every rank copies its input into its own output slot and puts it directly
into every peer's output, one thread block per peer; a signal/wait per pair marks arrival. In place
(allgather_allpairs_inplace) the input already is the rank's own output slot, so there is no copy."""

from ferry.dsl import CollectiveProgram, MemoryChannel


def program(world_size: int, *, name: str = "allgather_allpairs", channel=MemoryChannel,
            inplace: bool = False) -> CollectiveProgram:
    w = world_size
    with CollectiveProgram(name, "allgather", world_size=w, input_chunks=1, inplace=inplace) as prog:
        ch = {(r, p): channel(r, p) for r in range(w) for p in range(w) if r != p}
        for r in range(w):
            me = prog.rank(r)
            if not inplace:
                me.copy(me.input[0], me.output[r], tb=0)
            for tb, p in enumerate(p for p in range(w) if p != r):
                ch[r, p].put(me.input[0], prog.rank(p).output[r], tb=tb)
                ch[r, p].signal(tb=tb)
                ch[p, r].pair.wait(tb=tb)
    return prog
