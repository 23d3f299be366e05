"""AllGather, all pairs: every rank puts its input directly into every peer's output, one thread
block per peer, and copies it into its own output slot while the first put is on its way; a
signal/wait per pair marks arrival. In place
(allgather_allpairs_inplace) the input already is the rank's own output slot, so there is no copy."""

from ferry.dsl import CollectiveProgram, MemoryChannel


def program(world_size: int, *, name: str = "allgather_allpairs", channel=MemoryChannel,
            inplace: bool = False, copy_blocks: int = 0) -> CollectiveProgram:
    """``copy_blocks`` > 0: the own copy runs on that many thread blocks of its own, after the
    peers' (the input then has that many chunks); 0: on thread block 0, between its signal and its
    wait, where it overlaps the flight of the put rather than delaying it."""
    w, k = world_size, max(1, copy_blocks)
    with CollectiveProgram(name, "allgather", world_size=w, input_chunks=k, inplace=inplace) as prog:
        ch = {(r, p): channel(r, p) for r in range(w) for p in range(w) if r != p}
        for r in range(w):
            me = prog.rank(r)
            mine = prog.rank(r).output[r * k:(r + 1) * k]
            for tb, p in enumerate(p for p in range(w) if p != r):
                ch[r, p].put(me.input[0:k], prog.rank(p).output[r * k:(r + 1) * k], tb=tb)
                ch[r, p].signal(tb=tb)
                if tb == 0 and not inplace and copy_blocks == 0:
                    me.copy(me.input[0], mine, tb=0)
                ch[p, r].pair.wait(tb=tb)
            if not inplace and copy_blocks > 0:
                for j in range(k):
                    me.copy(me.input[j], me.output[r * k + j], tb=w - 1 + j)
    return prog
