"""A rank of a collective program: its buffers, and the local ops it runs on its thread blocks.

Local ops read and write this rank's own buffers; a source may also be a peer's memory read through
a memory channel (``ch.remote(ref)``). Every op names the thread block that runs it with ``tb=``;
ops of one thread block run in the order they are recorded.

    >>> r = prog.rank(0)
    >>> r.copy(r.input[0], r.output[0], tb=0)
    >>> r.reduce([r.output[0], r.scratch[0]], r.output[0], tb=0)   # output[0] += scratch[0]
    >>> r.barrier()                                               # every thread block of rank 0

@pre every reference of one op has the same chunk count; local references belong to this rank.
"""

from __future__ import annotations

from typing import Sequence

from .buffer import Buffer, ChunkRef
from .channel import Channel, RemoteRef
from .record import Op, check_counts, check_local


class Rank:
    """Rank ``rank`` of a CollectiveProgram; get it with ``program.rank(r)``."""

    def __init__(self, rank: int, input_chunks: int, output_chunks: int, scratch_chunks: int):
        self.rank = rank
        self.input = Buffer(rank, "input", input_chunks)
        self.output = Buffer(rank, "output", output_chunks)
        self.scratch = Buffer(rank, "scratch", scratch_chunks)
        self.channels: list[Channel] = []
        self.thread_blocks: dict[int, list[Op]] = {}
        self.barriers = 0

    def record(self, tb: int, op: Op) -> None:
        """Appends ``op`` to thread block ``tb`` (created on first use, after any earlier barriers)."""
        if not isinstance(tb, int) or isinstance(tb, bool) or tb < 0:
            raise ValueError(f"rank {self.rank}: tb must be a non-negative int, not {tb!r}")
        self.thread_blocks.setdefault(tb, [Op("barrier")] * self.barriers).append(op)

    def copy(self, src: ChunkRef, dst: ChunkRef, *, tb: int) -> None:
        """dst = src, both local."""
        check_local(self.rank, "copy", src, dst)
        check_counts("copy", src, dst)
        self.record(tb, Op("copy", src=src, dst=dst))

    def reduce(self, srcs: Sequence[ChunkRef | RemoteRef], dst: ChunkRef, *, tb: int) -> None:
        """dst = reduction of srcs; dst's old value counts only if dst is among srcs."""
        srcs = self._srcs("reduce", srcs)
        check_local(self.rank, "reduce", dst)
        check_counts("reduce", dst, *srcs)
        self.record(tb, Op("reduce", srcs=tuple(srcs), dst=dst))

    def unpack_packets(self, src: ChunkRef, dst: ChunkRef, *, tb: int) -> None:
        """LL: waits for the packets in local scratch ``src`` and writes their data to ``dst``."""
        self._packets("unpack_packets", src, dst, tb)

    def reduce_packets(self, src: ChunkRef, dst: ChunkRef, *, tb: int) -> None:
        """LL: waits for the packets in local scratch ``src`` and reduces their data into ``dst``
        (dst = dst + data)."""
        self._packets("reduce_packets", src, dst, tb)

    def read_reduce_copy_send(self, srcs: Sequence[ChunkRef | RemoteRef], dst: ChunkRef,
                              sends: Sequence[tuple[Channel, ChunkRef]], *, tb: int) -> None:
        """dst = reduction of srcs, also written to each (channel, peer ref) of ``sends``."""
        srcs = self._srcs("read_reduce_copy_send", srcs)
        check_local(self.rank, "read_reduce_copy_send", dst)
        for ch, ref in sends:
            ch.check_end(self.rank, "read_reduce_copy_send")
            ch.check_peer_ref("read_reduce_copy_send", ref)
        check_counts("read_reduce_copy_send", dst, *srcs, *(ref for _, ref in sends))
        self.record(tb, Op("read_reduce_copy_send", srcs=tuple(srcs), dst=dst,
                           sends=tuple((ch, ref) for ch, ref in sends)))

    def barrier(self) -> None:
        """Every thread block of this rank (including ones created later) reaches this point before
        any passes it."""
        self.barriers += 1
        for ops in self.thread_blocks.values():
            ops.append(Op("barrier"))

    def _packets(self, kind: str, src: ChunkRef, dst: ChunkRef, tb: int) -> None:
        check_local(self.rank, kind, src, dst)
        if src.buffer != "scratch":
            raise ValueError(f"rank {self.rank} {kind}: src must be scratch, not {src.buffer}")
        check_counts(kind, src, dst)
        self.record(tb, Op(kind, src=src, dst=dst))

    def _srcs(self, kind: str, srcs: Sequence[ChunkRef | RemoteRef]) -> list[ChunkRef | RemoteRef]:
        srcs = list(srcs)
        if not srcs:
            raise ValueError(f"rank {self.rank} {kind}: needs at least one source")
        for s in srcs:
            if isinstance(s, RemoteRef):
                s.channel.check_end(self.rank, kind)
            else:
                check_local(self.rank, kind, s)
        return srcs
