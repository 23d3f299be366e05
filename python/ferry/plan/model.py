"""The plan data model: immutable dataclasses mirroring docs/plan-format.md, version 1.

Objects are built by ``load_plan`` (which validates them) and turned back into JSON-ready dicts by
``dump_plan``. They hold tuples, not lists, so plans compare and hash by value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORMAT = "ferry-plan"
VERSION = 1

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")
PROTOCOLS = ("Simple", "LL")
BUFFERS = ("input", "output", "scratch")
CHANNEL_TYPES = ("memory", "port", "switch")
OP_KINDS = (
    "put", "get", "signal", "wait", "flush", "copy", "reduce",
    "put_packets", "unpack_packets", "reduce_packets", "read_reduce_copy_send", "barrier",
)


@dataclass(frozen=True)
class ChunkRef:
    """``count`` chunks of one buffer starting at ``index``.

    ``channel`` is set only for a ``reduce``/``read_reduce_copy_send`` source that reads the peer's
    memory through that channel; whether another reference is the peer's is fixed by its op.
    """

    buffer: str
    index: int
    count: int = 1
    channel: int | None = None

    def indices(self) -> range:
        return range(self.index, self.index + self.count)


@dataclass(frozen=True)
class Send:
    """One remote destination of a ``read_reduce_copy_send``: the peer's ``dst`` over ``channel``."""

    channel: int
    dst: ChunkRef


@dataclass(frozen=True)
class Op:
    """One operation; fields that its ``kind`` does not use stay None or empty."""

    kind: str
    channel: int | None = None
    src: ChunkRef | None = None
    dst: ChunkRef | None = None
    srcs: tuple[ChunkRef, ...] = ()
    sends: tuple[Send, ...] = ()


@dataclass(frozen=True)
class ThreadBlock:
    id: int
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class Channel:
    type: str
    peer: int


@dataclass(frozen=True)
class Rank:
    rank: int
    channels: tuple[Channel, ...]
    thread_blocks: tuple[ThreadBlock, ...]


@dataclass(frozen=True)
class Chunks:
    input: int
    output: int
    scratch: int

    def of(self, buffer: str) -> int:
        return getattr(self, buffer)


@dataclass(frozen=True)
class Plan:
    name: str
    collective: str
    protocol: str
    inplace: bool
    world_size: int
    chunks: Chunks
    min_bytes: int
    max_bytes: int
    ranks: tuple[Rank, ...]
    root: int | None = field(default=None)
