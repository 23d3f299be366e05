"""The ranks of test_torch_symm.py: ferry.torch.symm on CUDA tensors (a rank per GPU, or ranks
sharing a lone GPU), every check against seeded data, outputs poisoned first. Each rank returns
its list of errors. SYMM_ONLY=<check function name> runs that check alone (to find which one fails).
"""

import os
import traceback

from rank_processes import report


def _seeded(torch, rank, n, seed, dtype, dev):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(n, generator=g).to(dtype).to(dev)


def _peer_views(torch, symm, dist, rank, n, dev, errors):
    """Each rank fills its own buffer; after a barrier every rank reads every rank's through
    get_buffer, element by element, at two offsets and dtypes."""
    count = 4096 + 3
    for seed, dtype in ((1, torch.float32), (2, torch.bfloat16)):
        t = symm.empty(count, dtype=dtype, device=dev)
        h = symm.rendezvous(t, dist.group.WORLD)
        if symm.rendezvous(t, dist.group.WORLD) is not h:
            errors.append(f"rank {rank}: a second rendezvous of the same tensor gave another handle")
        if (h.rank, h.world_size) != (rank, n):
            errors.append(f"rank {rank}: handle says rank {h.rank} of {h.world_size}")
        t.copy_(_seeded(torch, rank, count, seed, dtype, dev))
        h.barrier(channel=0)
        for r in range(n):
            want = _seeded(torch, r, count, seed, dtype, dev)
            got = h.get_buffer(r, (count,), dtype)
            if not torch.equal(got, want):
                errors.append(f"rank {rank}: {dtype} buffer of rank {r}: {int((got != want).sum())} wrong")
            tail = h.get_buffer(r, (count - 7,), dtype, storage_offset=7)
            if not torch.equal(tail, want[7:]):
                errors.append(f"rank {rank}: {dtype} buffer of rank {r} from element 7 differs")
        h.barrier(channel=0)  # nobody frees or rewrites while a peer still reads
        pad = h.get_signal_pad(rank)
        if pad.dtype != torch.uint32 or pad.numel() != h.signal_pad_size // 4 or int(pad.sum()) != 0:
            errors.append(f"rank {rank}: signal pad {pad.dtype} {pad.numel()} sum {int(pad.sum())} after barriers")


def _put_then_wait(torch, symm, dist, rank, n, dev, errors):
    """Rank r writes rank r+1's buffer, then put_signal; r+1 waits, then reads: the data is there,
    over many rounds with changing data (a missing release/acquire order shows as stale values)."""
    count = 1 << 16
    t = symm.empty(count, dtype=torch.float32, device=dev)
    h = symm.rendezvous(t)
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    out = torch.empty(count, device=dev)
    for round_ in range(50):
        t.fill_(float("nan"))  # poisoned: a read before the write shows
        h.barrier(channel=1)
        h.get_buffer(nxt, (count,), torch.float32).copy_(_seeded(torch, rank, count, 100 + round_, torch.float32, dev))
        h.put_signal(nxt, channel=0)
        h.wait_signal(prev, channel=0)
        out.copy_(t)
        want = _seeded(torch, prev, count, 100 + round_, torch.float32, dev)
        if not torch.equal(out, want):
            errors.append(f"rank {rank}: round {round_}: {int((out != want).sum())} of rank {prev}'s values "
                          f"not seen after wait_signal")
            break
    h.barrier(channel=1)


def _two_channels_two_streams(torch, symm, dist, rank, n, dev, errors):
    """Barriers on channel 0 from one stream and channel 1 from another, interleaved, then a graph
    that captures a barrier, replayed: no hang, no error."""
    t = symm.empty(1024, dtype=torch.float32, device=dev)
    h = symm.rendezvous(t)
    s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    for _ in range(200):
        with torch.cuda.stream(s1):
            h.barrier(channel=0)
        with torch.cuda.stream(s2):
            h.barrier(channel=1)
    torch.cuda.synchronize(dev)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        t.add_(1.0)
        h.barrier(channel=2)
        try:
            symm.rendezvous(symm.empty(16, device=dev))
            errors.append(f"rank {rank}: empty/rendezvous inside a graph capture did not raise")
        except RuntimeError as e:
            if "captured" not in str(e):
                errors.append(f"rank {rank}: rendezvous in a capture: {e}")
    t.zero_()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize(dev)
    if not torch.equal(t, torch.full_like(t, 5.0)):
        errors.append(f"rank {rank}: a captured barrier + add replayed 5 times gave {t[:4].tolist()}")


def _mem_pool(torch, symm, dist, rank, n, dev, errors):
    """Tensors allocated inside the symmetric pool rendezvous too, and peers see their data."""
    pool = symm.get_mem_pool(dev)
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(1 << 20, device=dev)
        b = torch.empty(3000, device=dev)
    for seed, x in ((7, a), (8, b)):
        h = symm.rendezvous(x)
        x.copy_(_seeded(torch, rank, x.numel(), seed, torch.float32, dev))
        h.barrier()
        for r in range(n):
            if not torch.equal(h.get_buffer(r, (x.numel(),), torch.float32),
                               _seeded(torch, r, x.numel(), seed, torch.float32, dev)):
                errors.append(f"rank {rank}: pool tensor of {x.numel()} elements: rank {r}'s differs")
        h.barrier()


def _puts(torch, symm, dist, rank, n, dev, errors):
    """ferry's put: rank r copies seeded data into rank r+1's buffer at an odd offset, by the copy
    engines and by 1 and 24 thread blocks, odd sizes included, then put_signal; r+1 waits and checks
    every element, and that the poisoned elements around the range are untouched."""
    count = (1 << 18) + 5
    t = symm.empty(count + 64, dtype=torch.bfloat16, device=dev)
    h = symm.rendezvous(t)
    nxt, prev = (rank + 1) % n, (rank - 1) % n
    for round_, (blocks, size, offset) in enumerate(((0, count, 3), (1, 1001, 7), (24, count, 1), (24, 13, 0))):
        t.fill_(float("nan"))
        h.barrier(channel=1)
        src = _seeded(torch, rank, size, 200 + round_, torch.bfloat16, dev)
        h.put(nxt, src, storage_offset=offset, blocks=blocks)
        h.put_signal(nxt, channel=0)
        h.wait_signal(prev, channel=0)
        got = t[offset:offset + size].clone()
        want = _seeded(torch, prev, size, 200 + round_, torch.bfloat16, dev)
        if not torch.equal(got, want):
            errors.append(f"rank {rank}: put by {blocks} blocks of {size} at {offset}: "
                          f"{int((got != want).sum())} of rank {prev}'s values wrong")
        untouched = torch.cat([t[:offset], t[offset + size:]])
        if not bool(torch.isnan(untouched.float()).all()):
            errors.append(f"rank {rank}: put by {blocks} blocks of {size} at {offset} wrote outside its range")
    h.barrier(channel=1)
    for call, what in ((lambda: h.put(nxt, t[:8], storage_offset=count + 60), "past the buffer"),
                       (lambda: h.put(n, t[:8]), "rank"), (lambda: h.put(nxt, t[:8], blocks=5000), "blocks")):
        try:
            call()
            errors.append(f"rank {rank}: a put {what} was accepted")
        except Exception as e:  # ferry.InvalidUsage
            if f"rank {rank}" not in str(e):
                errors.append(f"rank {rank}: the put error does not name the rank: {e}")


def _errors(torch, symm, dist, rank, n, dev, errors):
    try:
        symm.rendezvous(torch.empty(16, device=dev))
        errors.append(f"rank {rank}: rendezvous of a plain torch.empty tensor was accepted")
    except ValueError as e:
        if "symm.empty" not in str(e):
            errors.append(f"rank {rank}: plain tensor: {e}")
    h = symm.rendezvous(symm.empty(8, device=dev))
    for call in (lambda: h.get_buffer(0, (9,), torch.float32), lambda: h.get_buffer(n, (1,), torch.float32),
                 lambda: h.get_signal_pad(0, (h.signal_pad_size,), torch.uint32)):
        try:
            call()
            errors.append(f"rank {rank}: an out-of-range view was accepted")
        except ValueError as e:
            if f"rank {rank}" not in str(e):
                errors.append(f"rank {rank}: the error does not name the rank: {e}")
    try:
        h.put_signal(0, channel=h.signal_pad_size)
        errors.append(f"rank {rank}: a channel past the signal pad was accepted")
    except Exception as e:  # ferry.InvalidUsage
        if "channel" not in str(e):
            errors.append(f"rank {rank}: bad channel: {e}")


def _abort(torch, symm, dist, rank, n, dev, errors):
    """Rank 0 waits on a channel nobody signals, with a 10-minute bound; rank 1 aborts the
    rendezvous from its host: rank 0's wait gives up at once, with no error, and its GPU goes on."""
    import time

    h = symm.rendezvous(symm.empty(8, device=dev))
    h.barrier(channel=0)
    if rank == 0:
        h.wait_signal(1, channel=1, timeout_ms=600_000)
    dist.barrier()
    started = time.monotonic()
    if rank == 1:
        h.abort()
    torch.cuda.synchronize(dev)
    waited = time.monotonic() - started
    if waited > 60:
        errors.append(f"rank {rank}: the aborted wait took {waited:.0f} s to give up")
    after = torch.ones(4, device=dev) * 2
    if after.sum().item() != 8:
        errors.append(f"rank {rank}: the GPU is not usable after the abort")


def run_rank(init_file, rank, n, results):
    errors = []
    try:
        import torch
        import torch.distributed as dist

        import ferry.torch.symm as symm

        torch.cuda.set_device(rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=n)
        for check in (_peer_views, _put_then_wait, _puts, _two_channels_two_streams, _mem_pool, _errors, _abort):
            if os.environ.get("SYMM_ONLY") and check.__name__ != os.environ["SYMM_ONLY"]:
                continue
            check(torch, symm, dist, rank, n, dev, errors)
            torch.cuda.synchronize(dev)
            dist.barrier()
        dist.destroy_process_group()
    except Exception:
        errors.append(f"rank {rank}: {traceback.format_exc()}")
    report(results, (rank, errors))
