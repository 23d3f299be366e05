"""The ferry collective-program DSL: write a program in Python, compile it to a plan.

    >>> from ferry.dsl import CollectiveProgram, MemoryChannel
    >>> with CollectiveProgram("ag", "allgather", world_size=2, input_chunks=1) as prog:
    ...     ...                      # ranks, buffers, channels, ops; see program.py
    >>> prog.to_plan()

Command line: ``python -m ferry.dsl compile PROGRAM.py --ranks 4 -o plan.json`` and
``python -m ferry.dsl verify plan.json`` (see ``ferry.dsl.cli``).
"""

from .buffer import Buffer, ChunkRef
from .channel import Channel, MemoryChannel, PortChannel, RemoteRef, SwitchChannel
from .program import CollectiveProgram
from .rank import Rank

__all__ = ["Buffer", "Channel", "ChunkRef", "CollectiveProgram", "MemoryChannel", "PortChannel", "Rank",
           "RemoteRef", "SwitchChannel"]
