"""The recorded form of an op and the argument checks shared by ranks and channels.

An ``Op`` holds DSL objects (``ChunkRef``, ``Channel``, ``RemoteRef``); ``layout`` turns it into the
plan's JSON form once instances and pipelining are known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .buffer import ChunkRef


@dataclass(frozen=True)
class Op:
    """One op of the plan format (docs/plan-format.md, "Operations"), fields as DSL objects."""

    kind: str
    channel: Any = None
    src: ChunkRef | None = None
    dst: ChunkRef | None = None
    srcs: tuple = field(default=())
    sends: tuple = field(default=())

    def count(self) -> int:
        """Chunks per reference (all references agree); 0 for ops without references."""
        refs = [r for r in (self.src, self.dst) if r is not None]
        return refs[0].count if refs else 0


def check_local(rank: int, kind: str, *refs: ChunkRef) -> None:
    """Raises ValueError unless every ref is a ChunkRef of ``rank``."""
    for ref in refs:
        if not isinstance(ref, ChunkRef):
            raise TypeError(f"rank {rank} {kind}: expected a chunk reference, not {type(ref).__name__}")
        if ref.rank != rank:
            raise ValueError(f"rank {rank} {kind}: {ref.buffer}[{ref.index}] belongs to rank {ref.rank}, "
                             f"not to this rank")


def check_counts(kind: str, *refs: Any) -> None:
    """Raises ValueError unless all refs (ChunkRef or RemoteRef) have the same chunk count."""
    counts = sorted({r.count for r in refs})
    if len(counts) > 1:
        raise ValueError(f"{kind}: all references must have the same chunk count, found {counts}")
