"""Built-in algorithms by name, under torchrun:

    torchrun --nproc-per-node 2 python/examples/builtin_algorithms.py

Every rank all-reduces a tensor with the algorithm the selector picks, then with each all-reduce
algorithm this Comm has forced in turn, and checks every element.
"""

import os

import torch

import ferry

local_rank = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()  # ranks may share a GPU
torch.cuda.set_device(local_rank)
comm = ferry.Comm()  # meets the other ranks through torchrun's store
n, rank = comm.world_size, comm.rank

for info in comm.algorithms():
    if info.collective == ferry.Collective.all_reduce and rank == 0:
        print(f"{info.name:28} {info.kind:8} {info.constraints}")

want = float(n * (n + 1) // 2)
for name in [""] + [a.name for a in comm.algorithms() if a.collective == ferry.Collective.all_reduce]:
    comm.set_algorithm("all_reduce", name)  # "" lets the selector choose
    x = torch.full((1 << 20,), float(rank + 1), device="cuda")
    try:
        comm.all_reduce(x)
    except ferry.InvalidUsage as e:  # e.g. a zero-copy algorithm on unregistered memory
        if rank == 0:
            print(f"{name}: {e}")
        continue
    torch.cuda.synchronize()
    assert torch.all(x == want), name
    if rank == 0:
        print(f"{name or 'selector choice'}: ok")
comm.set_algorithm("all_reduce", "")
