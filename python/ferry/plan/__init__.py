"""Plans (docs/plan-format.md): the data model, loading with validation, dumping, and the CPU verifier.

    from ferry.plan import load_plan
    from ferry.plan.verify import verify
    for finding in verify(load_plan("plan.json")):
        print(finding)

The verifier stays in its module (``ferry.plan.verify``, also the command line) rather than being
re-exported here: a package attribute ``verify`` would shadow, or be shadowed by, that module.
"""

from .dump import dump_plan
from .load import PlanError, load_plan
from .model import Channel, ChunkRef, Chunks, Op, Plan, Rank, Send, ThreadBlock

__all__ = ["Channel", "ChunkRef", "Chunks", "Op", "Plan", "PlanError", "Rank", "Send", "ThreadBlock",
           "dump_plan", "load_plan"]
