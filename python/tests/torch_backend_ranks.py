"""What each rank of test_torch_backend.py runs (a module of its own, so that spawned ranks import
it): torch.distributed on the ferry backend, every op checked element by element against a
reference built from seeded inputs, outputs poisoned first."""

import os
import sys
import traceback

from rank_processes import report

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
        _step(f"WRONG: {errors[-1]}")  # at once: a run killed later still shows it


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
    _rooted(torch, dist, rank, n, dev, errors)
    _streams_and_graphs(torch, dist, rank, n, dev, errors)
    _groups(torch, dist, rank, n, dev, errors)
    _registered(torch, dist, rank, n, dev, errors)
    _step("barrier")
    dist.barrier()


def _rooted(torch, dist, rank, n, dev, errors):
    """reduce, gather, scatter to and from the last rank; the coalesced forms."""
    _step("reduce, gather, scatter, coalesced")
    root = n - 1
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        ins = _all(torch, n, (1000,), dtype, 970, dev)
        x = ins[rank].clone()
        dist.reduce(x, dst=root, op=dist.ReduceOp.SUM)
        if rank == root:
            _close(torch, x, torch.stack(ins).sum(0), f"reduce {dtype}", errors, rank)
        outs = [_poisoned(torch, ins[rank]) for _ in range(n)] if rank == root else None
        dist.gather(ins[rank], gather_list=outs, dst=root)
        if rank == root:
            _close(torch, torch.cat(outs), torch.cat(ins), f"gather {dtype}", errors, rank)
        parts = _all(torch, n, (333,), dtype, 980, dev)
        out = _poisoned(torch, parts[rank])
        dist.scatter(out, scatter_list=[p.clone() for p in parts] if rank == root else None, src=root)
        _close(torch, out, parts[rank], f"scatter {dtype}", errors, rank)
    # reduce_scatter and all_to_all in their list forms
    ins = [_all(torch, n, (100,), torch.float32, 990 + p, dev) for p in range(n)]  # ins[p][r]: rank r's block p
    out = _poisoned(torch, ins[0][rank])
    dist.reduce_scatter(out, [ins[p][rank] for p in range(n)])
    _close(torch, out, torch.stack(ins[rank]).sum(0), "reduce_scatter (list)", errors, rank)
    outs = [_poisoned(torch, ins[0][rank]) for _ in range(n)]
    dist.all_to_all(outs, [ins[p][rank] for p in range(n)])
    _close(torch, torch.cat(outs), torch.cat([ins[rank][p] for p in range(n)]), "all_to_all (list)", errors, rank)
    # Several ops in one coalescing block (what FSDP2 issues), and all_reduce_coalesced.
    ins = _all(torch, n, (4, 256), torch.float32, 995, dev)
    gathered = [_poisoned(torch, torch.empty(n * 256, device=dev)) for _ in range(4)]
    scattered = [_poisoned(torch, torch.empty(256 // n, device=dev)) for _ in range(4)]
    from torch.distributed.distributed_c10d import _coalescing_manager

    with _coalescing_manager(device=dev, async_ops=True) as cm:
        for i in range(4):
            dist.all_gather_into_tensor(gathered[i], ins[rank][i])
    cm.wait()
    for i in range(4):
        _close(torch, gathered[i], torch.cat([ins[r][i] for r in range(n)]), f"coalesced all_gather {i}", errors, rank)
    with _coalescing_manager(device=dev, async_ops=True) as cm:
        for i in range(4):
            dist.reduce_scatter_tensor(scattered[i], ins[rank][i])
    cm.wait()
    for i in range(4):
        want = torch.stack([ins[r][i] for r in range(n)]).sum(0).view(n, -1)[rank]
        _close(torch, scattered[i], want, f"coalesced reduce_scatter {i}", errors, rank)
    xs = [ins[rank][i].clone() for i in range(4)]
    dist.all_reduce_coalesced(xs)
    for i in range(4):
        _close(torch, xs[i], torch.stack([ins[r][i] for r in range(n)]).sum(0), f"all_reduce_coalesced {i}", errors,
               rank)


def _streams_and_graphs(torch, dist, rank, n, dev, errors):
    """The stream contract: an async op's input freed right after the launch keeps its memory until
    the op is done; a sync op orders after the current stream's work; capture and replay."""
    _step("freed inputs, sync order, graph capture")
    for trial in range(3):
        x = torch.full((1 << 22,), float(rank + trial), device=dev)
        out = torch.empty(n * (1 << 22), device=dev)
        torch.cuda._sleep(20_000_000)  # the backend's stream waits for this before reading x
        work = dist.all_gather_into_tensor(out, x, async_op=True)
        del x  # its memory must not be handed out while the op may still read it
        junk = torch.full((1 << 22,), -7.0, device=dev)  # same size: the allocator's first choice
        work.wait()
        want = torch.cat([torch.full((1 << 22,), float(r + trial), device=dev) for r in range(n)])
        _close(torch, out, want, f"async all_gather, input freed after the launch ({trial})", errors, rank)
        del junk
    x = torch.zeros(1 << 16, device=dev)
    torch.cuda._sleep(20_000_000)
    x.fill_(float(rank + 1))  # written on the current stream just before a synchronous op
    dist.all_reduce(x)
    _close(torch, x, torch.full_like(x, float(n * (n + 1) // 2)), "sync all_reduce after a long kernel", errors, rank)
    # Two streams, one group: the op on the second stream runs after the first's (whose stream is
    # held by a long kernel), as NCCL orders a communicator's calls; FSDP issues ops like this.
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    xa = torch.full((1 << 18,), float(rank + 1), device=dev)
    xb = torch.full((1 << 10,), float(rank + 2), device=dev)
    a.wait_stream(torch.cuda.current_stream())
    b.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(a):
        torch.cuda._sleep(20_000_000)
        dist.all_reduce(xa)
    with torch.cuda.stream(b):
        dist.all_reduce(xb)
    torch.cuda.synchronize()
    _close(torch, xa, torch.full_like(xa, float(n * (n + 1) // 2)), "all_reduce on stream a", errors, rank)
    _close(torch, xb, torch.full_like(xb, float(n * (n + 3) // 2)), "all_reduce on stream b, after a", errors, rank)
    # CUDA graph: a synchronous all_reduce and an async all_gather, captured once, replayed on new data.
    static = torch.zeros(4096, device=dev)
    gathered = torch.empty(n * 4096, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture (first calls may set up)
        dist.all_reduce(static)
        dist.all_gather_into_tensor(gathered, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(static)
        work = dist.all_gather_into_tensor(gathered, static, async_op=True)
        work.wait()
    for replay in range(3):
        vals = [_seeded(torch, r, (4096,), torch.float32, 1100 + replay, dev) for r in range(n)]
        gathered.fill_(float("nan"))
        static.copy_(vals[rank])
        graph.replay()
        total = torch.stack(vals).sum(0)
        _close(torch, static, total, f"graph replay {replay}: all_reduce", errors, rank)
        _close(torch, gathered, torch.cat([total] * n), f"graph replay {replay}: all_gather", errors, rank)
    torch.cuda.synchronize()


def _registered(torch, dist, rank, n, dev, errors):
    """ferry.torch.register_tensor: ops on registered tensors (sizes past the LL range, so that the
    zero-copy algorithms run) give the same answers; views inside a registration count; after
    deregister the same tensors still work (staged again)."""
    import ferry.torch as ft

    _step("register_tensor")
    count = 1 << 20
    ins = _all(torch, n, (count,), torch.float32, 900, dev)
    want = torch.stack(ins).sum(0)
    buf = torch.empty(2 * count, device=dev)  # [0, count): all_reduce; the whole: all_gather's output
    src = ins[rank].clone()
    with ft.register_tensor(buf), ft.register_tensor(src):
        x = buf[:count]
        x.copy_(ins[rank])
        dist.all_reduce(x)
        _close(torch, x, want, "all_reduce on a registered tensor", errors, rank)
        gathered = buf.view(2, count)[1][: count // n * n].view(n, count // n)
        gathered.fill_(float("nan"))
        dist.all_gather_into_tensor(gathered, src[: count // n])
        _close(torch, gathered, torch.stack([i[: count // n] for i in ins]), "all_gather into a registered view",
               errors, rank)
        out = _poisoned(torch, src[: count // n])
        dist.reduce_scatter_tensor(out, src)  # input registered, output not: staged, on every rank alike
        _close(torch, out, want[rank * (count // n):(rank + 1) * (count // n)], "reduce_scatter, input registered",
               errors, rank)
    x = buf[:count]
    x.copy_(ins[rank])
    dist.all_reduce(x)
    _close(torch, x, want, "all_reduce after deregister", errors, rank)
    try:
        ft.register_tensor(torch.ones(4))
        errors.append(f"rank {rank}: register_tensor took a CPU tensor")
    except ValueError as e:
        if "CUDA" not in str(e):
            errors.append(f"rank {rank}: register_tensor of a CPU tensor: {e} does not say CUDA")
    torch.cuda.synchronize()


def _groups(torch, dist, rank, n, dev, errors):
    """new_group (through the group's store), split_group (through the parent's bootstrap), and a
    group aborted: its later ops are errors naming it, never hangs."""
    _step("new_group, split_group, abort")
    g = dist.new_group(list(range(n)))
    x = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(x, group=g)
    _close(torch, x, torch.full_like(x, float(n * (n + 1) // 2)), "all_reduce on new_group", errors, rank)
    if hasattr(dist, "split_group"):
        # Listed in reverse (torch 2.11 sorts the list, later versions keep its order): each rank
        # contributes its parent rank, gathered in the order of the split group's ranks.
        sub = dist.split_group(split_ranks=[list(reversed(range(n)))])
        x = torch.full((10,), float(rank), device=dev)
        out = _poisoned(torch, torch.empty(n * 10, device=dev))
        dist.all_gather_into_tensor(out, x, group=sub)
        want = torch.cat([torch.full((10,), float(dist.get_global_rank(sub, r)), device=dev) for r in range(n)])
        _close(torch, out, want, "all_gather on split_group", errors, rank)
        dist.destroy_process_group(sub)
    from torch.distributed.distributed_c10d import _abort_process_group

    _abort_process_group(g)  # on every rank; torch forgets the group, its object still works
    try:
        g.allreduce([torch.ones(4, device=dev)]).wait()
        errors.append(f"rank {rank}: all_reduce on an aborted group did not raise")
        _step(f"WRONG: {errors[-1]}")
    except Exception as e:  # noqa: BLE001 - which type torch wraps it in varies
        if "aborted" not in str(e):
            errors.append(f"rank {rank}: all_reduce on an aborted group: {e!r} does not say aborted")
            _step(f"WRONG: {errors[-1]}")


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
        # Bound to its device (device_id), as split_group needs in torch 2.11.
        dist.init_process_group("cpu:gloo,cuda:ferry", init_method=f"file://{init_file}", rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=60), device_id=dev)
        assert dist.get_backend() == "cpu:gloo,cuda:ferry", dist.get_backend()
        _checks(torch, dist, rank, n, dev, errors)
        _step("destroy_process_group")
        dist.destroy_process_group()
        _step("done")
    except BaseException:  # reported to the parent, which fails the test
        errors.append(f"rank {rank}: {traceback.format_exc()}")
        _step(f"FAILED: {errors[-1]}")
    # os._exit skips the interpreter's teardown (torch's and ferry's atexit work after the group is
    # gone), so the result must have reached the pipe before it.
    report(results, (rank, errors))
    os._exit(0)


def mismatch_rank(init_file, rank, n, results):
    """Ranks that disagree: rank r all-reduces 100 * (r + 1) elements. Each must get an error (ferry's
    check of the call's shape, or the device timeout's), never hang; it reports what it got."""
    global _rank
    _rank = rank
    outcome = "no error"
    try:
        import datetime

        import torch
        import torch.distributed as dist

        import ferry.torch  # noqa: F401  (registers "ferry")

        torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group("cpu:gloo,cuda:ferry", init_method=f"file://{init_file}", rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=60))
        x = torch.ones(100 * (rank + 1), device="cuda")
        _step("a mismatched all_reduce")
        try:
            dist.all_reduce(x)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - what matters is that one comes, and what it says
            outcome = f"{type(e).__name__}: {e}"
    except BaseException:
        outcome = f"setup failed: {traceback.format_exc()}"
    _step(f"outcome: {outcome[:300]}")
    report(results, (rank, outcome))
    os._exit(0)  # the CUDA context may be unusable after a trap: no teardown


def several_hosts_rank(init_file, rank, n, results):
    """Ranks that say they are on different hosts (FERRY_HOSTID): the group goes to NCCL, which runs
    its ops (one all_reduce, checked); reports the cuda backend's class and any error."""
    global _rank
    _rank = rank
    errors = []
    backend = None
    try:
        os.environ["FERRY_HOSTID"] = f"host{rank}"  # before ferry reads its environment
        import datetime

        import torch
        import torch.distributed as dist

        import ferry.torch  # noqa: F401  (registers "ferry")

        torch.cuda.set_device(rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("cpu:gloo,cuda:ferry", init_method=f"file://{init_file}", rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=60))
        x = torch.full((1 << 16,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        _close(torch, x, torch.full_like(x, float(n * (n + 1) // 2)), "all_reduce of a group on several hosts",
               errors, rank)
        backend = type(dist.group.WORLD._get_backend(dev)).__name__
        dist.destroy_process_group()
    except BaseException:
        errors.append(f"rank {rank}: {traceback.format_exc()}")
    report(results, (rank, (backend, errors)))
    os._exit(0)
