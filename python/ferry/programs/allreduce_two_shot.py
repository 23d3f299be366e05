"""AllReduce in two shots over memory channels (Simple protocol).

Input chunk c is owned by rank c. Reduce-scatter: every rank puts chunk p to rank p's scratch and
signals; rank p waits for all peers and reduces its own chunk into its output. All-gather: rank p
puts its reduced chunk into every peer's output and signals; each rank's last waits mean its output
is complete. One channel per ordered pair; its n-th wait consumes the sender's n-th signal.

Rank r visits its peers from r + 1 on (not from rank 0 up), so that at each step of the puts every
rank writes to a different peer rather than all to the same one; and it makes all of a phase's puts
before its signals, so that the executor fences once per phase rather than once per peer
(docs/executor.md). On 4 H200 the plan, written peer by peer from rank 0, took 2.2-2.8 times the
native direct kernel's time.

It is correct in place too (allreduce_two_shot_inplace): rank p's output chunk p is its input
chunk p, which the peers read only before they signal the first phase, and p reduces into it only
after waiting for those signals; a peer overwrites p's chunk r only once it has p's first signal.
"""

from ferry.dsl import CollectiveProgram, MemoryChannel
from ferry.programs.reducescatter_allpairs import slot  # same scratch layout for the first phase


def program(world_size: int, *, name: str = "allreduce_two_shot", inplace: bool = False) -> CollectiveProgram:
    w = world_size
    with CollectiveProgram(name, "allreduce", world_size=w, input_chunks=w, scratch_chunks=w - 1,
                           inplace=inplace) as prog:
        ch = {(r, p): MemoryChannel(r, p) for r in range(w) for p in range(w) if r != p}
        peers = {r: [(r + i) % w for i in range(1, w)] for r in range(w)}
        for r in range(w):
            me = prog.rank(r)
            for p in peers[r]:
                ch[r, p].put(me.input[p], prog.rank(p).scratch[slot(r, p)], tb=0)
            for p in peers[r]:
                ch[r, p].signal(tb=0)
            for p in peers[r]:
                ch[p, r].pair.wait(tb=0)
            # The sum's order as before: the own chunk, then the peers' from rank 0 up.
            me.reduce([me.input[r]] + [me.scratch[slot(p, r)] for p in sorted(peers[r])], me.output[r], tb=0)
            for p in peers[r]:
                ch[r, p].put(me.output[r], prog.rank(p).output[r], tb=0)
            for p in peers[r]:
                ch[r, p].signal(tb=0)
            for p in peers[r]:
                ch[p, r].pair.wait(tb=0)
    return prog
