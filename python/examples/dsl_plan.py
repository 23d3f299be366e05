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


def allgather_ring(w):
    """A ring: at step s every rank forwards chunk (rank - s) mod w to the next rank, which waits
    for it before forwarding it on at step s + 1 (one thread block, one channel each way)."""
    with CollectiveProgram("example_allgather_ring", "allgather", world_size=w, input_chunks=1) as prog:
        to_next = {r: MemoryChannel(r, (r + 1) % w) for r in range(w)}
        for r in range(w):
            me = prog.rank(r)
            me.copy(me.input[0], me.output[r], tb=0)
        for s in range(w - 1):
            for r in range(w):
                me, k = prog.rank(r), (r - s) % w
                src = me.input[0] if s == 0 else me.output[k]
                to_next[r].put(src, prog.rank((r + 1) % w).output[k], tb=0)
                to_next[r].signal(tb=0)
            for r in range(w):
                to_next[(r - 1) % w].pair.wait(tb=0)  # chunk (r - 1 - s) mod w is here
    return prog


name = comm.add_plan(allgather_ring(n))  # collective: every rank adds the same program
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
