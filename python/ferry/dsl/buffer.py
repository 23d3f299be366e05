"""Buffers of one rank, sliced into chunks, and the chunk references that ops take.

A rank has three buffers, ``input``, ``output`` and ``scratch``, each a row of equal chunks
(docs/plan-format.md, "Buffers and chunks"). Indexing a buffer gives a ``ChunkRef``:

    >>> r = prog.rank(1)
    >>> r.input[2]          # one chunk:  ChunkRef(rank=1, buffer='input', index=2, count=1)
    >>> r.scratch[0:3]      # three chunks starting at 0
    >>> r.output[7]         # IndexError naming rank 1, buffer "output" and its chunk count

@pre  slices are contiguous (no step) and non-empty; indices are non-negative.
"""

from __future__ import annotations

from dataclasses import dataclass

BUFFERS = ("input", "output", "scratch")


@dataclass(frozen=True)
class ChunkRef:
    """``count`` chunks of ``rank``'s ``buffer`` starting at ``index`` (always in range)."""

    rank: int
    buffer: str
    index: int
    count: int

    def chunk(self, i: int) -> ChunkRef:
        """The i-th single chunk of this reference."""
        return ChunkRef(self.rank, self.buffer, self.index + i, 1)


class Buffer:
    """One buffer of one rank: ``size`` chunks, indexed by int or contiguous slice."""

    def __init__(self, rank: int, name: str, size: int):
        self.rank, self.name, self.size = rank, name, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: int | slice) -> ChunkRef:
        if isinstance(key, int) and not isinstance(key, bool):
            start, stop = key, key + 1
        elif isinstance(key, slice):
            if key.step not in (None, 1):
                raise ValueError(f'rank {self.rank} buffer "{self.name}": chunk slices take no step')
            start = 0 if key.start is None else key.start
            stop = self.size if key.stop is None else key.stop
        else:
            raise TypeError(f'rank {self.rank} buffer "{self.name}": index with an int or a slice, '
                            f"not {type(key).__name__}")
        if not 0 <= start < stop <= self.size:
            raise IndexError(f'rank {self.rank} buffer "{self.name}": chunks [{start}, {stop}) are out of '
                             f"range of {self.size} chunks")
        return ChunkRef(self.rank, self.name, start, stop - start)
