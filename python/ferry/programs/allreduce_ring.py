"""AllReduce on a ring over memory channels: ring reduce-scatter, then ring all-gather.

Rank r sends to r + 1. Reduce-scatter step s (0 .. w-2): rank r sends its partial of chunk
(r - s) mod w (its input at s = 0, its output after) into scratch slot s of rank r + 1 and signals;
rank r + 1 waits and adds that slot to its input chunk, in its output. After w - 1 steps rank r holds
the sum of chunk (r + 1) mod w. All-gather step t: rank r puts output chunk (r + 1 - t) mod w into
rank r + 1's output and signals; rank r + 1 waits and forwards it next step. Each rank runs one
thread block per instance; two instances share the bandwidth by default, and ``pipeline=k`` splits
every chunk into k sub-chunks that flow around the ring one after the other.
"""

from ferry.dsl import CollectiveProgram, MemoryChannel


def program(world_size: int, instances: int = 2, pipeline: int = 1) -> CollectiveProgram:
    w = world_size
    with CollectiveProgram("allreduce_ring", "allreduce", world_size=w, input_chunks=w,
                           scratch_chunks=w - 1, instances=instances, pipeline=pipeline) as prog:
        send = [MemoryChannel(r, (r + 1) % w) for r in range(w)]
        for r in range(w):
            me, nxt = prog.rank(r), prog.rank((r + 1) % w)
            recv = send[(r - 1) % w].pair
            for s in range(w - 1):
                c_out, c_in = (r - s) % w, (r - 1 - s) % w
                send[r].put(me.input[c_out] if s == 0 else me.output[c_out], nxt.scratch[s], tb=0)
                send[r].signal(tb=0)
                recv.wait(tb=0)
                me.reduce([me.input[c_in], me.scratch[s]], me.output[c_in], tb=0)
            for t in range(w - 1):
                c = (r + 1 - t) % w
                send[r].put(me.output[c], nxt.output[c], tb=0)
                send[r].signal(tb=0)
                recv.wait(tb=0)
    return prog
