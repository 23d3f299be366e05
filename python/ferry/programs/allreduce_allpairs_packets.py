"""AllReduce, one shot with LL packets: every rank sends its whole input to every peer's scratch as
packets, then adds the peers' packets to a copy of its own input. Latency-bound sizes.

Rank r's scratch slot for sender s is ``s`` if s < r else ``s - 1`` (world_size - 1 slots).
"""

from ferry.dsl import CollectiveProgram, MemoryChannel


def slot(sender: int, receiver: int) -> int:
    """The scratch chunk of ``receiver`` that holds ``sender``'s input."""
    return sender if sender < receiver else sender - 1


def program(world_size: int) -> CollectiveProgram:
    with CollectiveProgram("allreduce_allpairs_packets", "allreduce", world_size=world_size,
                           input_chunks=1, scratch_chunks=world_size - 1, protocol="LL",
                           max_bytes=1 << 20) as prog:
        for r in range(world_size):
            me = prog.rank(r)
            for p in range(world_size):
                if p != r:
                    MemoryChannel(r, p).put_packets(me.input[0], prog.rank(p).scratch[slot(r, p)], tb=0)
            me.copy(me.input[0], me.output[0], tb=0)
            for p in range(world_size):
                if p != r:
                    me.reduce_packets(me.scratch[slot(p, r)], me.output[0], tb=0)
    return prog
