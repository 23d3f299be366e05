"""Channels: MemoryChannel, PortChannel, SwitchChannel.

Creating a channel from ``src_rank`` to ``dst_rank`` adds one channel to each rank, so the pairing
rule of docs/plan-format.md holds by construction: the k-th channel of a type from r to p pairs with
the k-th of that type from p to r. The object is the ``src_rank`` end; ``.pair`` is the other end.
Ops recorded on an end run on that end's rank:

    >>> ch = MemoryChannel(0, 1)                                 # inside `with CollectiveProgram(...)`
    >>> ch.put(prog.rank(0).input[0], prog.rank(1).scratch[0], tb=0)
    >>> ch.signal(tb=0)                                          # rank 0: the put is complete ...
    >>> ch.pair.wait(tb=0)                                       # ... for rank 1 after this wait
    >>> prog.rank(1).reduce([r1.input[0], r1.scratch[0]], r1.output[0], tb=0)

Which end may do what: put/signal/wait on every type; get, ``remote`` reads and ``reduce`` on memory
channels only; flush on port channels only; put_packets on memory and port channels; ``broadcast``
(one local chunk put to several peers, each over its own channel) on any.
@pre a channel end carries its signals from one thread block, so that "the n-th wait consumes the
     n-th signal" is well defined.
"""

from __future__ import annotations

from dataclasses import dataclass

from .buffer import ChunkRef
from .context import current_program
from .record import Op, check_counts, check_local


@dataclass(frozen=True)
class RemoteRef:
    """The peer's chunks ``ref`` read through ``channel`` (a source of reduce/read_reduce_copy_send)."""

    channel: Channel
    ref: ChunkRef

    @property
    def count(self) -> int:
        return self.ref.count


class Channel:
    """One end of a channel pair; use the subclasses. ``index`` is its position in its rank's list."""

    type = ""

    def __init__(self, src_rank: int, dst_rank: int, *, _pair: Channel | None = None):
        program = current_program() if _pair is None else _pair.program
        program.check_rank(src_rank)
        program.check_rank(dst_rank)
        if src_rank == dst_rank:
            raise ValueError(f"{type(self).__name__}({src_rank}, {dst_rank}): a channel joins two different ranks")
        self.program, self.rank, self.peer = program, src_rank, dst_rank
        owner = program.rank(src_rank)
        self.index = len(owner.channels)
        owner.channels.append(self)
        self.pair = _pair if _pair is not None else type(self)(dst_rank, src_rank, _pair=self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.rank}->{self.peer}, index {self.index})"

    def put(self, src: ChunkRef, dst: ChunkRef, *, tb: int) -> None:
        """Copies local ``src`` to the peer's ``dst``."""
        self._transfer("put", src, dst, tb)

    def signal(self, *, tb: int) -> None:
        """Tells the peer; its matching wait then sees this thread block's earlier writes. A port
        channel's signal first waits for the channel's earlier puts to land; a memory channel's
        signal does not wait for port puts."""
        self.program.rank(self.rank).record(tb, Op("signal", channel=self))

    def wait(self, *, tb: int) -> None:
        """Consumes the next signal from the peer's end."""
        self.program.rank(self.rank).record(tb, Op("wait", channel=self))

    def get(self, src: ChunkRef, dst: ChunkRef, *, tb: int) -> None:
        """Copies the peer's ``src`` to local ``dst`` (memory channels)."""
        self._need("get", MemoryChannel)
        self.check_peer_ref("get", src)
        check_local(self.rank, "get", dst)
        check_counts("get", src, dst)
        self.program.rank(self.rank).record(tb, Op("get", channel=self, src=src, dst=dst))

    def flush(self, *, tb: int) -> None:
        """Waits until this channel's earlier puts have landed (port channels); a later signal of
        this thread block, on any channel, then orders them before the peer's matching wait."""
        self._need("flush", PortChannel)
        self.program.rank(self.rank).record(tb, Op("flush", channel=self))

    def put_packets(self, src: ChunkRef, dst: ChunkRef, *, tb: int) -> None:
        """LL: sends local ``src`` as packets to the peer's scratch ``dst``; needs no signal."""
        self._need("put_packets", MemoryChannel, PortChannel)
        if dst.buffer != "scratch":
            raise ValueError(f"rank {self.rank} put_packets: dst must be the peer's scratch, not {dst.buffer}")
        self._transfer("put_packets", src, dst, tb)

    def reduce(self, src: ChunkRef, dst: ChunkRef, *, tb: int) -> None:
        """Local ``dst`` = ``dst`` reduced with the peer's ``src``, read over this channel (memory
        channels): the plan's ``reduce`` op with sources [dst, the peer's src]."""
        self._need("reduce", MemoryChannel)
        self.check_peer_ref("reduce", src)
        self.program.rank(self.rank).reduce([dst, self.remote(src)], dst, tb=tb)

    @staticmethod
    def broadcast(channels: list[Channel], src: ChunkRef, dst: ChunkRef, *, tb: int) -> None:
        """Puts local ``src`` to ``dst``'s chunks on every channel's peer (one put each, in order), then
        signals each channel: each peer's matching wait sees the data."""
        if not channels:
            raise ValueError("broadcast: no channels")
        rank = channels[0].rank
        for ch in channels:
            ch.check_end(rank, "broadcast")
        peer_dst = [ChunkRef(ch.peer, dst.buffer, dst.index, dst.count) for ch in channels]
        for ch, ref in zip(channels, peer_dst):
            ch.put(src, ref, tb=tb)
        for ch in channels:
            ch.signal(tb=tb)

    def remote(self, ref: ChunkRef) -> RemoteRef:
        """The peer's chunks ``ref`` as a source of reduce / read_reduce_copy_send (memory channels)."""
        self._need("remote reads", MemoryChannel)
        self.check_peer_ref("remote", ref)
        return RemoteRef(self, ref)

    def check_end(self, rank: int, kind: str) -> None:
        """Raises ValueError unless this end belongs to ``rank``."""
        if self.rank != rank:
            raise ValueError(f"rank {rank} {kind}: {self!r} is rank {self.rank}'s end; use .pair")

    def check_peer_ref(self, kind: str, ref: ChunkRef) -> None:
        """Raises ValueError unless ``ref`` names the peer's memory."""
        if not isinstance(ref, ChunkRef) or ref.rank != self.peer:
            raise ValueError(f"rank {self.rank} {kind} on {self!r}: expected a chunk of rank {self.peer}, "
                             f"got {ref!r}")

    def _transfer(self, kind: str, src: ChunkRef, dst: ChunkRef, tb: int) -> None:
        check_local(self.rank, kind, src)
        self.check_peer_ref(kind, dst)
        check_counts(kind, src, dst)
        self.program.rank(self.rank).record(tb, Op(kind, channel=self, src=src, dst=dst))

    def _need(self, what: str, *types: type) -> None:
        if not isinstance(self, types):
            names = " or ".join(t.__name__ for t in types)
            raise ValueError(f"rank {self.rank}: {what} needs a {names}, not {type(self).__name__}")


class MemoryChannel(Channel):
    """The GPU loads/stores the peer's memory (NVLink/P2P). ``MemoryChannel(src_rank, dst_rank)``."""

    type = "memory"


class PortChannel(Channel):
    """A host proxy performs the transfers (copy engine, RDMA, TCP); flush completes them."""

    type = "port"


class SwitchChannel(Channel):
    """NVLink multicast; described for completeness, never run where multicast is disabled."""

    type = "switch"
