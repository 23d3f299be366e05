"""A collective program written in the DSL, compiled in this process and run as an algorithm of the
Comm, under torchrun:

    torchrun --nproc-per-node 2 python/examples/dsl_plan.py
"""

import os

import torch

import ferry
from ferry.dsl import CollectiveProgram, MemoryChannel

local_rank = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()  # ranks may share a GPU
torch.cuda.set_device(local_rank)
comm = ferry.Comm()
n, rank = comm.world_size, comm.rank


def allgather_allpairs(w):
    """Every rank puts its input into every peer's output slot, one thread block per peer."""
    with CollectiveProgram("example_allgather", "allgather", world_size=w, input_chunks=1) as prog:
        ch = {(r, p): MemoryChannel(r, p) for r in range(w) for p in range(w) if r != p}
        for r in range(w):
            me = prog.rank(r)
            me.copy(me.input[0], me.output[r], tb=0)
            for tb, p in enumerate(p for p in range(w) if p != r):
                ch[r, p].put(me.input[0], prog.rank(p).output[r], tb=tb)
                ch[r, p].signal(tb=tb)
                ch[p, r].pair.wait(tb=tb)
    return prog


name = comm.add_plan(allgather_allpairs(n))  # collective: every rank adds the same program
comm.set_algorithm("all_gather", name)
x = torch.full((4096,), float(rank), device="cuda")
out = torch.empty(4096 * n, device="cuda")
comm.all_gather(x, out)
torch.cuda.synchronize()
assert torch.equal(out, torch.arange(n, device="cuda").float().repeat_interleave(4096))
if rank == 0:
    print(f"{name}: ok on {n} ranks")
comm.set_algorithm("all_gather", "")
comm.remove_algorithm(name)
