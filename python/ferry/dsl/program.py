"""CollectiveProgram: the context a collective program is written in.

    >>> with CollectiveProgram("allgather_direct", "allgather", world_size=2, input_chunks=1) as prog:
    ...     for r in range(2):
    ...         me, peer = prog.rank(r), prog.rank(1 - r)
    ...         ch = MemoryChannel(r, 1 - r)
    ...         me.copy(me.input[0], me.output[r], tb=0)
    ...         ch.put(me.input[0], peer.output[r], tb=0)
    ...         ch.signal(tb=0)
    ...         ch.pair.wait(tb=0)
    >>> plan = prog.to_plan()          # a dict in the format of docs/plan-format.md

Chunk counts: ``input_chunks`` is given; ``output_chunks`` follows from the collective (allgather:
world_size * input, reducescatter: input / world_size, the others: input). ``instances=n`` lays the
program out n times over disjoint chunks, thread blocks and channels; ``pipeline=k`` splits every
chunk into k sub-chunks that each thread block processes one after the other (see ``layout``).
@pre channels are created while the program is the innermost active one (inside its ``with``).
"""

from __future__ import annotations

from . import context
from .layout import lay_out
from .rank import Rank

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")
PROTOCOLS = ("Simple", "LL")


class CollectiveProgram:
    """A collective program under construction; ``to_plan()`` emits it as a plan dict."""

    def __init__(self, name: str, collective: str, *, world_size: int, input_chunks: int,
                 scratch_chunks: int = 0, protocol: str = "Simple", inplace: bool = False,
                 min_bytes: int = 0, max_bytes: int = 1 << 40, instances: int = 1, pipeline: int = 1,
                 root: int | None = None):
        if collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, not {collective!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
        for what, value, lo in (("world_size", world_size, 1), ("input_chunks", input_chunks, 1),
                                ("scratch_chunks", scratch_chunks, 0), ("instances", instances, 1),
                                ("pipeline", pipeline, 1), ("min_bytes", min_bytes, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise ValueError(f"{what} must be an int >= {lo}, not {value!r}")
        if max_bytes < min_bytes:
            raise ValueError(f"max_bytes {max_bytes} is below min_bytes {min_bytes}")
        if (collective == "broadcast") != (root is not None):
            raise ValueError("root is required for broadcast and allowed only there")
        if root is not None and not 0 <= root < world_size:
            raise ValueError(f"root {root} is not a rank of world_size {world_size}")
        output_chunks = input_chunks
        if collective == "allgather":
            output_chunks = input_chunks * world_size
        elif collective in ("reducescatter", "alltoall") and input_chunks % world_size:
            raise ValueError(f"{collective} needs input_chunks divisible by world_size {world_size}, "
                             f"not {input_chunks}")
        elif collective == "reducescatter":
            output_chunks = input_chunks // world_size
        self.name, self.collective, self.protocol, self.inplace = name, collective, protocol, inplace
        self.world_size, self.root = world_size, root
        self.min_bytes, self.max_bytes = min_bytes, max_bytes
        self.instances, self.pipeline = instances, pipeline
        self.chunks = {"input": input_chunks, "output": output_chunks, "scratch": scratch_chunks}
        self._ranks = [Rank(r, input_chunks, output_chunks, scratch_chunks) for r in range(world_size)]

    def __enter__(self) -> CollectiveProgram:
        context.enter(self)
        return self

    def __exit__(self, *exc) -> None:
        context.leave(self)

    def check_rank(self, r: int) -> None:
        """Raises ValueError unless ``r`` is a rank of this program."""
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < self.world_size:
            raise ValueError(f"rank {r!r} does not exist (world_size {self.world_size})")

    def rank(self, r: int) -> Rank:
        """Rank ``r`` (its buffers, local ops and channels)."""
        self.check_rank(r)
        return self._ranks[r]

    @property
    def ranks(self) -> list[Rank]:
        return list(self._ranks)

    def to_plan(self) -> dict:
        """The plan as a JSON-ready dict (docs/plan-format.md, version 1)."""
        return lay_out(self)
