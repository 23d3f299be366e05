"""ReduceScatter, all pairs: rank r puts input chunk p into rank p's scratch (one thread block per
peer) and signals; thread block 0 waits for every peer, then reduces its own input chunk and the
peers' contributions into its output in one op."""

from ferry.dsl import CollectiveProgram, MemoryChannel


def slot(sender: int, receiver: int) -> int:
    """The scratch chunk of ``receiver`` that holds ``sender``'s contribution."""
    return sender if sender < receiver else sender - 1


def program(world_size: int) -> CollectiveProgram:
    w = world_size
    with CollectiveProgram("reducescatter_allpairs", "reducescatter", world_size=w, input_chunks=w,
                           scratch_chunks=w - 1) as prog:
        ch = {(r, p): MemoryChannel(r, p) for r in range(w) for p in range(w) if r != p}
        for r in range(w):
            me = prog.rank(r)
            peers = [p for p in range(w) if p != r]
            for tb, p in enumerate(peers):
                ch[r, p].put(me.input[p], prog.rank(p).scratch[slot(r, p)], tb=tb)
                ch[r, p].signal(tb=tb)
            for p in peers:
                ch[p, r].pair.wait(tb=0)
            me.reduce([me.input[r]] + [me.scratch[slot(p, r)] for p in peers], me.output[0], tb=0)
    return prog
