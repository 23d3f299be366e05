"""What each rank of test_torch_backend.py runs (a module of its own, so that spawned ranks import
it): torch.distributed on the ferry backend, every op checked element by element against a
reference built from seeded inputs, outputs poisoned first."""

import os
import sys
import traceback

_rank = None


def _step(what):
    """A progress line on stderr (pytest -s shows it): where a rank was when a run hangs."""
    print(f"[torch backend rank {_rank}] {what}", file=sys.stderr, flush=True)


def _seeded(torch, rank, shape, dtype, seed, dev):
    g = torch.Generator(device="cpu").manual_seed(seed * 1000 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype).to(dev)
    return torch.randint(-50, 50, shape, generator=g).to(dtype).to(dev)


def _all(torch, n, shape, dtype, seed, dev):
    return [_seeded(torch, r, shape, dtype, seed, dev) for r in range(n)]


def _close(torch, got, want, what, errors, rank):
    want = want.to(got.dtype)
    if got.dtype.is_floating_point:
        tol = 2e-2 if got.dtype in (torch.bfloat16, torch.float16) else 1e-5
        ok = torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    if not ok:
        errors.append(f"rank {rank}: {what}: got {got.flatten()[:4].tolist()}, want {want.flatten()[:4].tolist()}")


def _poisoned(torch, like):
    out = torch.empty_like(like)
    out.fill_(float("nan") if like.dtype.is_floating_point else 77)
    return out


def _checks(torch, dist, rank, n, dev, errors):
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.int8]
    counts = [1, 1023, 1 << 16]
    seed = 0
    for dtype in dtypes:
        for count in counts:
            seed += 1
            tag = f"{dtype} x {count}"
            _step(tag)
            ins = _all(torch, n, (count,), dtype, seed, dev)
            ops = [(dist.ReduceOp.SUM, lambda s: s.sum(0)), (dist.ReduceOp.MAX, lambda s: s.max(0).values),
                   (dist.ReduceOp.MIN, lambda s: s.min(0).values)]
            if dtype.is_floating_point:
                ops.append((dist.ReduceOp.AVG, lambda s: s.float().mean(0)))
            stacked = torch.stack(ins)
            for op, ref in ops:
                x = ins[rank].clone()
                dist.all_reduce(x, op=op)
                _close(torch, x, ref(stacked), f"all_reduce {op} {tag}", errors, rank)
            # broadcast from the last rank
            x = ins[rank].clone() if rank == n - 1 else _poisoned(torch, ins[rank])
            dist.broadcast(x, src=n - 1)
            _close(torch, x, ins[n - 1], f"broadcast {tag}", errors, rank)
            # all_gather_into_tensor and the list form
            out = _poisoned(torch, torch.empty(n * count, dtype=dtype, device=dev))
            dist.all_gather_into_tensor(out, ins[rank])
            _close(torch, out, torch.cat(ins), f"all_gather_into_tensor {tag}", errors, rank)
            outs = [_poisoned(torch, ins[rank]) for _ in range(n)]
            dist.all_gather(outs, ins[rank])
            _close(torch, torch.cat(outs), torch.cat(ins), f"all_gather {tag}", errors, rank)
            # reduce_scatter_tensor: every rank's input holds n blocks of count
            big = _all(torch, n, (n * count,), dtype, seed + 500, dev)
            out = _poisoned(torch, ins[rank])
            dist.reduce_scatter_tensor(out, big[rank])
            want = torch.stack(big).sum(0)[rank * count:(rank + 1) * count]
            _close(torch, out, want, f"reduce_scatter_tensor {tag}", errors, rank)
            # all_to_all_single, even splits
            out = _poisoned(torch, big[rank])
            dist.all_to_all_single(out, big[rank])
            want = torch.cat([big[p][rank * count:(rank + 1) * count] for p in range(n)])
            _close(torch, out, want, f"all_to_all_single {tag}", errors, rank)
    _step("all_to_all_single uneven")
    # Uneven all_to_all_single: rank r sends (r + p + 1) rows to rank p.
    rows = lambda r, p: r + p + 1  # noqa: E731
    send = [_seeded(torch, r, (sum(rows(r, p) for p in range(n)), 3), torch.float32, 900, dev) for r in range(n)]
    out = torch.full((sum(rows(p, rank) for p in range(n)), 3), float("nan"), device=dev)
    dist.all_to_all_single(out, send[rank], output_split_sizes=[rows(p, rank) for p in range(n)],
                           input_split_sizes=[rows(rank, p) for p in range(n)])
    want = torch.cat([send[p][sum(rows(p, q) for q in range(rank)):][:rows(p, rank)] for p in range(n)])
    _close(torch, out, want, "all_to_all_single uneven", errors, rank)
    # PREMUL_SUM with a scalar factor.
    x = _seeded(torch, rank, (257,), torch.float32, 950, dev)
    want = sum(_seeded(torch, r, (257,), torch.float32, 950, dev) for r in range(n)) * 0.5
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5))
    _close(torch, x, want, "all_reduce PREMUL_SUM 0.5", errors, rank)
    _step("batch_isend_irecv, async all_reduce")
    # send/recv in a ring with batch_isend_irecv, and an async all_reduce after a long kernel.
    buf = _seeded(torch, rank, (4096,), torch.float32, 960, dev)
    got = torch.full_like(buf, float("nan"))
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, (rank + 1) % n),
                                   dist.P2POp(dist.irecv, got, (rank - 1) % n)])
    for r in reqs:
        r.wait()
    _close(torch, got, _seeded(torch, (rank - 1) % n, (4096,), torch.float32, 960, dev), "batch_isend_irecv", errors,
           rank)
    a = torch.randn(2048, 2048, device=dev)
    x = torch.full((1 << 20,), float(rank + 1), device=dev)
    torch.cuda._sleep(50_000_000)  # a long kernel on the current stream, then the input written after it
    x.mul_(2)
    work = dist.all_reduce(x, async_op=True)
    del a
    work.wait()
    _close(torch, x, torch.full_like(x, float(n * (n + 1))), "async all_reduce after a long kernel", errors, rank)
    _step("barrier")
    dist.barrier()


def run_rank(init_file, rank, n, results):
    global _rank
    _rank = rank
    errors = []
    try:
        import datetime
        import faulthandler

        _step("started")
        faulthandler.dump_traceback_later(200, exit=True)  # a hang prints every thread's stack

        import torch
        import torch.distributed as dist

        import ferry.torch  # noqa: F401  (registers "ferry")

        torch.cuda.set_device(rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
        _step("init_process_group")
        dist.init_process_group("cpu:gloo,cuda:ferry", init_method=f"file://{init_file}", rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=60))
        assert dist.get_backend() == "cpu:gloo,cuda:ferry", dist.get_backend()
        _checks(torch, dist, rank, n, dev, errors)
        _step("destroy_process_group")
        dist.destroy_process_group()
        _step("done")
    except BaseException:  # reported to the parent, which fails the test
        errors.append(f"rank {rank}: {traceback.format_exc()}")
    results.put((rank, errors))
    # os._exit skips the interpreter's teardown (torch's and ferry's atexit work after the group is
    # gone), so the queue's feeder thread must have written the result before it.
    results.close()
    results.join_thread()
    os._exit(0)
