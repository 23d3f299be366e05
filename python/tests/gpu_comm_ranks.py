"""What each rank of test_gpu_comm.py runs (a module of its own, so that spawned ranks import it).

Every check: seeded inputs with small integer values (so sums, products, maxima and minima are exact
in every type, and the reference is exact too), the output poisoned first, every element compared
with a torch reference computed from all ranks' inputs. A rank returns the list of what was wrong.
"""

import os
import sys
import time

import ferry

DTYPES = {
    "float32": ferry.DataType.float32,
    "float16": ferry.DataType.float16,
    "bfloat16": ferry.DataType.bfloat16,
    "float64": ferry.DataType.float64,
    "int32": ferry.DataType.int32,
    "int64": ferry.DataType.int64,
    "int8": ferry.DataType.int8,
    "uint8": ferry.DataType.uint8,
}
OPS = ["sum", "prod", "max", "min", "avg"]


def _torch_dtype(torch, name):
    return getattr(torch, name)


def _inputs(torch, name, count, rank, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    low = 0 if name == "uint8" else -3
    return torch.randint(low, 4, (count,), generator=g).to(_torch_dtype(torch, name))


def _poison(torch, t):
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(113)
    return t


def _reduce(torch, stacked, op, name, n):
    wide = stacked.double() if stacked.is_floating_point() else stacked.long()
    if op == "sum":
        out = wide.sum(0)
    elif op == "prod":
        out = wide.prod(0)
    elif op == "max":
        out = wide.amax(0)
    elif op == "min":
        out = wide.amin(0)
    elif op == "avg":
        out = wide.sum(0) / n if stacked.is_floating_point() else torch.div(wide.sum(0), n, rounding_mode="trunc")
    return out.to(stacked.dtype)


def _same(torch, got, want, name, op):
    if got.numel() != want.numel():
        return False
    if op == "avg" and got.is_floating_point():
        tol = 1e-2 if name in ("float16", "bfloat16") else 1e-6
        return torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    return torch.equal(got.cpu(), want.cpu())


def _progress(rank, stage, t0):
    """One line per stage on stderr (pytest -s shows it): where a slow or stuck run is."""
    print(f"rank {rank}: {stage} at {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)


def run_rank(uid, rank, n, plan_checks, results):
    os.environ.setdefault("FERRY_SOCKET_IFNAME", "lo")
    t0 = time.monotonic()
    import torch

    errors = []
    try:
        gpus = torch.cuda.device_count()
        torch.cuda.set_device(rank % gpus)
        dev = torch.device("cuda", rank % gpus)
        _progress(rank, "torch ready", t0)
        comm = ferry.Comm(ferry.TcpBootstrap.create(uid, rank, n, timeout=60))
        _progress(rank, "Comm made", t0)
        errors += _collectives(torch, comm, dev, rank, n, t0)
        errors += _streams_and_errors(torch, comm, dev, rank, n)
        _progress(rank, "streams, PreMulSum, refusals, registration done", t0)
        if plan_checks:
            errors += _plan_at_run_time(torch, comm, dev, rank, n)
            _progress(rank, "plan at run time done", t0)
        torch.cuda.synchronize()
    except BaseException as e:  # reported to the test, which fails with it
        import traceback

        errors.append(f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    results.put((rank, errors))


def _collectives(torch, comm, dev, rank, n, t0):
    errors = []
    seed = 0
    small = [0, 1, 1023, 4096]
    for name in DTYPES:
        td = _torch_dtype(torch, name)
        for count in small:
            for inplace in (False, True):
                seed += 1
                errors += _check_reductions(torch, comm, dev, rank, n, name, td, count, inplace, seed, OPS)
                errors += _check_moves(torch, comm, dev, rank, n, name, td, count, inplace, seed)
        _progress(rank, f"{name}: small sizes done", t0)
    for name in ("float32", "bfloat16"):
        td = _torch_dtype(torch, name)
        for nbytes in (1 << 20, 64 << 20):
            count = nbytes // torch.tensor([], dtype=td).element_size() // n * n
            for inplace in (False, True):
                seed += 1
                errors += _check_reductions(torch, comm, dev, rank, n, name, td, count, inplace, seed, ["sum"])
                errors += _check_moves(torch, comm, dev, rank, n, name, td, count, inplace, seed)
            _progress(rank, f"{name}: {nbytes >> 20} MiB done", t0)
    return errors


def _all_inputs(torch, name, count, n, seed, dev):
    return torch.stack([_inputs(torch, name, count, r, seed) for r in range(n)]).to(dev)


def _check_reductions(torch, comm, dev, rank, n, name, td, count, inplace, seed, ops):
    errors = []
    for op in ops:
        where = f"rank {rank}: {name} x{count} {op} {'in place' if inplace else 'out of place'}"
        rop = getattr(ferry.ReduceOp, op)
        # all_reduce
        allin = _all_inputs(torch, name, count, n, seed, dev)
        want = _reduce(torch, allin, op, name, n)
        x = allin[rank].clone()
        out = x if inplace else _poison(torch, torch.empty_like(x))
        comm.all_reduce(x, None if inplace else out, op=rop)
        torch.cuda.synchronize()
        if not _same(torch, out, want, name, op):
            errors.append(f"{where}: all_reduce wrong")
        # reduce_scatter: each rank's input is n blocks of `count`
        allbig = _all_inputs(torch, name, count * n, n, seed + 7, dev)
        wantrs = _reduce(torch, allbig, op, name, n)[rank * count:(rank + 1) * count]
        big = allbig[rank].clone()
        out = big[rank * count:(rank + 1) * count] if inplace else _poison(torch, torch.empty(count, dtype=td, device=dev))
        comm.reduce_scatter(big, out, op=rop)
        torch.cuda.synchronize()
        if not _same(torch, out, wantrs, name, op):
            errors.append(f"{where}: reduce_scatter wrong")
        # reduce to root n - 1
        root = n - 1
        x = allin[rank].clone()
        out = x if inplace else _poison(torch, torch.empty_like(x))
        before = out.clone()
        comm.reduce(x, root, None if inplace else out, op=rop)
        torch.cuda.synchronize()
        if rank == root and not _same(torch, out, want, name, op):
            errors.append(f"{where}: reduce wrong on the root")
        if rank != root and not inplace and not torch.equal(out.view(torch.uint8), before.view(torch.uint8)):
            errors.append(f"{where}: reduce wrote the output of a rank that is not the root")
    return errors


def _check_moves(torch, comm, dev, rank, n, name, td, count, inplace, seed):
    errors = []
    where = f"rank {rank}: {name} x{count} {'in place' if inplace else 'out of place'}"
    allin = _all_inputs(torch, name, count, n, seed + 3, dev)
    # all_gather
    want = allin.reshape(-1)
    out = _poison(torch, torch.empty(count * n, dtype=td, device=dev))
    if inplace:
        out[rank * count:(rank + 1) * count].copy_(allin[rank])
        x = out[rank * count:(rank + 1) * count]
    else:
        x = allin[rank].clone()
    comm.all_gather(x, out)
    torch.cuda.synchronize()
    if not torch.equal(out.view(torch.uint8), want.view(torch.uint8)):
        errors.append(f"{where}: all_gather wrong")
    # all_to_all: rank r's block p goes to rank p's block r
    if count % n == 0:
        c = count // n
        want = torch.cat([allin[p][rank * c:(rank + 1) * c] for p in range(n)])
        a = allin[rank].clone()
        b = a if inplace else _poison(torch, torch.empty_like(a))
        try:
            comm.all_to_all(a, b)
            torch.cuda.synchronize()
            if not torch.equal(b.view(torch.uint8), want.view(torch.uint8)):
                errors.append(f"{where}: all_to_all wrong")
        except ferry.InvalidUsage as e:
            if not inplace:
                errors.append(f"{where}: all_to_all refused: {e}")
    # broadcast from root 0
    x = allin[rank].clone()
    out = x if inplace else _poison(torch, torch.empty_like(x))
    comm.broadcast(x, 0, None if inplace else out)
    torch.cuda.synchronize()
    if not torch.equal(out.view(torch.uint8), allin[0].view(torch.uint8)):
        errors.append(f"{where}: broadcast wrong")
    # send/recv in a group: ring to the next rank
    if n > 1:
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        got = _poison(torch, torch.empty(count, dtype=td, device=dev))
        with comm.group():
            comm.send(allin[rank].clone(), nxt)
            comm.recv(got, prv)
        torch.cuda.synchronize()
        if not torch.equal(got.view(torch.uint8), allin[prv].view(torch.uint8)):
            errors.append(f"{where}: send/recv ring wrong")
    return errors


def _streams_and_errors(torch, comm, dev, rank, n):
    errors = []
    # A user stream: the call runs on it, ordered after work queued there.
    s = torch.cuda.Stream(device=dev)
    x = torch.full((1 << 16,), float(rank + 1), device=dev)
    with torch.cuda.stream(s):
        x.mul_(2)
        comm.all_reduce(x)  # torch's current stream inside the block is s
    s.synchronize()
    want = float(sum(2 * (r + 1) for r in range(n)))
    if not torch.all(x == want):
        errors.append(f"rank {rank}: all_reduce on a user stream wrong")
    y = torch.full((1 << 10,), float(rank + 1), device=dev)
    comm.all_reduce(y, stream=s)
    s.synchronize()
    if not torch.all(y == float(sum(r + 1 for r in range(n)))):
        errors.append(f"rank {rank}: all_reduce with stream= wrong")
    # PreMulSum with a number and with a device scalar.
    z = torch.full((4096,), float(rank + 1), device=dev)
    comm.all_reduce(z, op=ferry.PreMulSum(0.5))
    torch.cuda.synchronize()
    if not torch.all(z == 0.5 * sum(r + 1 for r in range(n))):
        errors.append(f"rank {rank}: PreMulSum(0.5) wrong")
    z.fill_(rank + 1)
    comm.all_reduce(z, op=ferry.PreMulSum(torch.tensor([2.0], device=dev)))
    torch.cuda.synchronize()
    if not torch.all(z == 2.0 * sum(r + 1 for r in range(n))):
        errors.append(f"rank {rank}: PreMulSum(device tensor) wrong")
    # Refusals before anything is queued.
    for what, call in [
        ("host tensor", lambda: comm.all_reduce(torch.ones(8))),
        ("non-contiguous", lambda: comm.all_reduce(torch.ones(8, 8, device=dev).t())),
        ("size mismatch", lambda: comm.all_gather(torch.ones(8, device=dev), torch.ones(8, device=dev))),
        ("type mismatch", lambda: comm.all_reduce(torch.ones(8, device=dev), torch.ones(8, device=dev).half())),
    ]:
        try:
            call()
            errors.append(f"rank {rank}: {what} was not refused")
        except ferry.InvalidUsage:
            pass
    # CuPy arrays, on CuPy's current stream (the device's default stream unless one is made current).
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        with cupy.cuda.Device(dev.index):
            a = cupy.full(4096, rank + 1, dtype=cupy.float32)
            out = cupy.full(4096 * n, cupy.nan, dtype=cupy.float32)
            comm.all_gather(a, out)
            cupy.cuda.get_current_stream().synchronize()
            want = cupy.repeat(cupy.arange(1, n + 1, dtype=cupy.float32), 4096)
            if not bool(cupy.all(out == want)):
                errors.append(f"rank {rank}: all_gather of CuPy arrays wrong")
    # Registered buffers: the zero-copy algorithms.
    r = torch.full((1 << 20,), float(rank + 1), device=dev)
    with comm.register_buffer(r):
        comm.all_reduce(r)
        torch.cuda.synchronize()
    if not torch.all(r == float(sum(q + 1 for q in range(n)))):
        errors.append(f"rank {rank}: all_reduce on a registered buffer wrong")
    return errors


def _plan_at_run_time(torch, comm, dev, rank, n):
    from ferry.programs.allgather_allpairs import program

    errors = []
    name = comm.add_plan(program(n, name="py_allgather_allpairs"))
    if name != "plan:py_allgather_allpairs" or name not in [a.name for a in comm.algorithms()]:
        errors.append(f"rank {rank}: add_plan gave {name!r}")
    comm.set_algorithm("all_gather", name)
    count = 4096
    x = torch.arange(count, device=dev, dtype=torch.float32) + rank * count
    out = _poison(torch, torch.empty(count * n, device=dev))
    comm.all_gather(x, out)
    torch.cuda.synchronize()
    if not torch.equal(out, torch.arange(count * n, device=dev, dtype=torch.float32)):
        errors.append(f"rank {rank}: all_gather through the plan wrong")
    comm.set_algorithm("all_gather", "")
    comm.remove_algorithm(name)
    if name in [a.name for a in comm.algorithms()]:
        errors.append(f"rank {rank}: the plan is still listed after remove_algorithm")
    return errors
