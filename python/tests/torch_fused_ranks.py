"""What each rank of test_torch_fused_ops.py runs (a module of its own, so that spawned ranks import
it): the ops of ferry.torch.fused_ops on a gloo group (CPU tensors), every output checked element by
element against the same product computed from every rank's seeded inputs, then traced with fake
tensors (what torch.compile does) for their shapes."""

import datetime
import os
import traceback

from rank_processes import report


def _seeded(torch, rank, shape, seed, dtype=None):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    t = torch.randn(shape, generator=g)
    return t if dtype is None else t.to(dtype)


def _check(torch, got, want, what, errors, rank):
    got = got.cpu()
    tol = 3e-2 if got.dtype in (torch.bfloat16, torch.float16) else 1e-4
    if got.shape != want.shape:
        errors.append(f"rank {rank}: {what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
    elif not torch.allclose(got.float(), want.float(), rtol=tol, atol=tol):
        diff = (got.float() - want.float()).abs().max().item()
        errors.append(f"rank {rank}: {what}: differs by up to {diff}")


def _all_gather_matmul(torch, ops, name, rank, n, errors, seed, dev):
    for dtype in (torch.float32, torch.bfloat16):
        for shape in ((4, 6), (2, 4, 6)):
            for gather_dim in list(range(len(shape))) + [-1]:
                seed += 1
                shards = [_seeded(torch, r, shape, seed, dtype) for r in range(n)]
                d = gather_dim % len(shape)
                full = torch.cat(shards, dim=d)
                k = full.shape[-1]
                Bs = [_seeded(torch, 100, (k, 5), seed, dtype), _seeded(torch, 101, (k, 3), seed, dtype)]
                kept = None
                for return_A in (True, False):
                    A, outs = ops.fused_all_gather_matmul(shards[rank].to(dev), [B.to(dev) for B in Bs], gather_dim, name,
                                                          return_A=return_A)
                    what = f"fused_all_gather_matmul {dtype} A{shape} gather_dim {gather_dim} return_A {return_A}"
                    if return_A:
                        kept = A
                    elif A is not None:
                        errors.append(f"rank {rank}: {what}: A is not None")
                    for i, (out, B) in enumerate(zip(outs, Bs)):
                        _check(torch, out, (full.float() @ B.float()).to(dtype), f"{what} (B{i})", errors, rank)
                # Checked after another call on other data: a returned A is the caller's, whatever the
                # op reuses (a registered workspace, say).
                ops.fused_all_gather_matmul((shards[rank] * 2).to(dev), [B.to(dev) for B in Bs], gather_dim, name,
                                            return_A=False)
                _check(torch, kept, full, f"fused_all_gather_matmul {dtype} A{shape} gather_dim {gather_dim} (A)",
                       errors, rank)
    # A strided shard (column-major): every form takes it as a contiguous one.
    seed += 1
    shards = [_seeded(torch, r, (4, 6), seed, torch.bfloat16) for r in range(n)]
    B = _seeded(torch, 100, (6, 5), seed, torch.bfloat16)
    strided = shards[rank].to(dev).t().contiguous().t()
    _, outs = ops.fused_all_gather_matmul(strided, [B.to(dev)], 0, name, return_A=False)
    _check(torch, outs[0], (torch.cat(shards).float() @ B.float()).to(torch.bfloat16),
           "fused_all_gather_matmul of a strided shard", errors, rank)
    return seed


def _matmul_reduce_scatter(torch, ops, name, rank, n, errors, seed, dev):
    for dtype in (torch.float32, torch.bfloat16):
        for shape in ((4 * n, 6), (2 * n, 2 * n, 6)):
            for scatter_dim in range(len(shape) - 1):
                for reduce_op in ("sum", "avg"):
                    seed += 1
                    As = [_seeded(torch, r, shape, seed, dtype) for r in range(n)]
                    B = [_seeded(torch, 200 + r, (6, 5), seed, dtype) for r in range(n)]
                    got = ops.fused_matmul_reduce_scatter(As[rank].to(dev), B[rank].to(dev), reduce_op, scatter_dim, name)
                    total = sum((As[r].float() @ B[r].float()).to(dtype).float() for r in range(n))
                    if reduce_op == "avg":
                        total = total / n
                    want = total.chunk(n, dim=scatter_dim)[rank].to(dtype)
                    _check(torch, got, want, f"fused_matmul_reduce_scatter {dtype} A{shape} scatter_dim {scatter_dim} "
                           f"{reduce_op}", errors, rank)
    # A strided A (column-major): every form takes it as a contiguous one.
    seed += 1
    As = [_seeded(torch, r, (4 * n, 6), seed, torch.bfloat16) for r in range(n)]
    B = _seeded(torch, 200, (6, 5), seed, torch.bfloat16)
    got = ops.fused_matmul_reduce_scatter(As[rank].to(dev).t().contiguous().t(), B.to(dev), "sum", 0, name)
    total = sum((As[r].float() @ B.float()).to(torch.bfloat16).float() for r in range(n))
    _check(torch, got, total.chunk(n)[rank].to(torch.bfloat16), "fused_matmul_reduce_scatter of a strided A",
           errors, rank)
    return seed


def _float32_accumulation(torch, ops, name, rank, n, errors, dev):
    """The contract's float32 accumulation, exactly: rank 0's product is 1 and every other rank's is
    3 x 2^-10, below half a bf16 step at 1. Summed in float32 and rounded once, n >= 3 ranks give
    1 + 3 (n - 1) 2^-10 rounded to bf16 (1.0078125 for 3 or 4 ranks); rounding after every addition
    would give 1. Rows of 8 x 64 per rank, the product of A (rows x 16) and B = 1/16 (exact)."""
    value = 1.0 if rank == 0 else 3 * 2.0 ** -10
    A = torch.full((8 * n, 16), value, dtype=torch.bfloat16, device=dev)
    B = torch.full((16, 64), 1.0 / 16, dtype=torch.bfloat16, device=dev)
    want = torch.tensor(1 + 3 * (n - 1) * 2.0 ** -10, dtype=torch.float64).to(torch.bfloat16).item()
    got = ops.fused_matmul_reduce_scatter(A, B, "sum", 0, name)
    wrong = (got.float().cpu() != want).sum().item()
    if got.shape != (8, 64) or wrong:
        errors.append(f"rank {rank}: fused_matmul_reduce_scatter bf16: {wrong} of {got.numel()} sums differ from "
                      f"{want} (float32 accumulation, one rounding); e.g. {got.flatten()[0].item()}")


def _scaled(torch, ops, name, rank, n, errors, seed, dev):
    f8 = torch.float8_e4m3fn
    M, K, N = 16, 16, 16  # torch._scaled_mm on CUDA wants K and N multiples of 16
    for rowwise in (False, True):
        seed += 1
        shards = [_seeded(torch, r, (M, K), seed).to(f8) for r in range(n)]
        B = _seeded(torch, 300, (N, K), seed).to(f8).t()  # column-major, as torch._scaled_mm wants it
        if rowwise:
            scales = [torch.rand(M, 1, generator=torch.Generator().manual_seed(seed + r)) + 0.5 for r in range(n)]
            B_scale = torch.rand(1, N, generator=torch.Generator().manual_seed(seed + 99)) + 0.5
        else:
            scales = [torch.tensor(0.5)] * n
            B_scale = torch.tensor(2.0)
        A_full = torch.cat([s.float() for s in shards])
        A_scale_full = torch.cat([s.reshape(-1, 1) for s in scales]) if rowwise else scales[0]
        want = ((A_full * A_scale_full) @ (B.float() * B_scale)).to(torch.bfloat16)
        A, outs = ops.fused_all_gather_scaled_matmul(shards[rank].to(dev), [B.to(dev)], scales[rank].to(dev),
                                                     [B_scale.to(dev)], 0, name, [None], [None], [torch.bfloat16],
                                                     [False])
        _check(torch, A.float(), A_full, f"fused_all_gather_scaled_matmul rowwise={rowwise} (A)", errors, rank)
        _check(torch, outs[0], want, f"fused_all_gather_scaled_matmul rowwise={rowwise}", errors, rank)
        # matmul + reduce-scatter: every rank's own A and scale, rows scattered.
        mine = torch.cat(shards)  # (n*M, K): each rank uses all shards, scaled by its rank
        a_scale = (torch.cat([s.reshape(-1, 1) for s in scales]) if rowwise else scales[0]) * (rank + 1)
        got = ops.fused_scaled_matmul_reduce_scatter(mine.to(dev), B.to(dev), a_scale.to(dev), B_scale.to(dev), "sum",
                                                     0, 0, name, [n * M, N], out_dtype=torch.bfloat16)
        each = [((A_full * ((torch.cat([s.reshape(-1, 1) for s in scales]) if rowwise else scales[0]) * (r + 1)))
                 @ (B.float() * B_scale)).to(torch.bfloat16).float() for r in range(n)]
        want = sum(each).chunk(n, dim=0)[rank].to(torch.bfloat16)
        _check(torch, got, want, f"fused_scaled_matmul_reduce_scatter rowwise={rowwise}", errors, rank)
    return seed


def _fake_shapes(torch, ops, name, rank, n, errors):
    """What torch.compile sees: the ops on fake tensors give the eager shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        A = torch.empty(2, 4, 6)
        A_out, outs = ops.fused_all_gather_matmul(A, [torch.empty(6, 5)], 1, name)
        C = ops.fused_matmul_reduce_scatter(torch.empty(4 * n, 6), torch.empty(6, 5), "avg", 0, name)
        shapes = (tuple(A_out.shape), tuple(outs[0].shape), tuple(C.shape))
    want = ((2, 4 * n, 6), (2, 4 * n, 5), (4, 5))
    if shapes != want:
        errors.append(f"rank {rank}: fake tensors: shapes {shapes}, want {want}")


def run_rank(init_file, rank, n, device, results):
    """device "cpu": a gloo group; "cuda": "cpu:gloo,cuda:ferry", each rank on GPU rank % count (ranks
    share a lone GPU), so that the collectives inside the ops run on ferry's backend."""
    errors = []
    try:
        import torch
        import torch.distributed as dist

        import ferry.torch  # noqa: F401  (registers the backend and torch.ops.ferry.*)

        backend = "gloo"
        dev = torch.device("cpu")
        if device == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            backend, dev = "cpu:gloo,cuda:ferry", torch.device("cuda", torch.cuda.current_device())
        # Waits without a bound of ferry's own (a bootstrap exchange, NCCL's collectives) end within
        # the harness's time: a hang there becomes an error or an exit code, not silence.
        bound = datetime.timedelta(seconds=120)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=n, timeout=bound)
        name = dist.group.WORLD.group_name
        ops = torch.ops.ferry

        def phase(what):
            # In the test's output (pytest -s): the last phase a rank began says where it stopped, if it
            # crashed; run_ranks shows where a hung one waits.
            print(f"torch_fused_ranks: rank {rank} of {n} ({device}): {what}", flush=True)

        phase("the composition")
        seed = _all_gather_matmul(torch, ops, name, rank, n, errors, 0, dev)
        seed = _matmul_reduce_scatter(torch, ops, name, rank, n, errors, seed, dev)
        _float32_accumulation(torch, ops, name, rank, n, errors, dev)
        if device == "cuda":
            # Again, pipelined on symmetric memory where it applies (fused_pipeline.cpp), then with
            # the composition's collectives on registered workspaces (registered_workspace.py).
            os.environ["FERRY_FUSED_PIPELINE"] = "1"
            phase("pipelined on symmetric memory")
            seed = _all_gather_matmul(torch, ops, name, rank, n, errors, seed, dev)
            seed = _matmul_reduce_scatter(torch, ops, name, rank, n, errors, seed, dev)
            _float32_accumulation(torch, ops, name, rank, n, errors, dev)
            seed = _scaled(torch, ops, name, rank, n, errors, seed, dev)  # (its reduce-scatter pipelined)
            os.environ.pop("FERRY_FUSED_PIPELINE")
            os.environ["FERRY_FUSED_REGISTERED"] = "1"
            phase("the composition on registered workspaces")
            seed = _all_gather_matmul(torch, ops, name, rank, n, errors, seed, dev)
            seed = _matmul_reduce_scatter(torch, ops, name, rank, n, errors, seed, dev)
            seed = _scaled(torch, ops, name, rank, n, errors, seed, dev)
            os.environ.pop("FERRY_FUSED_REGISTERED")
        phase("the scaled (fp8) ops")
        seed = _scaled(torch, ops, name, rank, n, errors, seed, dev)
        if device == "cuda" and torch.cuda.device_count() >= n:
            # A group on another backend (NCCL needs a GPU per rank): the composition runs on its
            # collectives (from C++ where the extension is built).
            phase("on an NCCL group")
            nccl = dist.new_group(backend="nccl", timeout=bound)
            seed = _all_gather_matmul(torch, ops, nccl.group_name, rank, n, errors, seed, dev)
            _matmul_reduce_scatter(torch, ops, nccl.group_name, rank, n, errors, seed, dev)
        phase("fake tensors and bad arguments")
        _fake_shapes(torch, ops, name, rank, n, errors)
        try:
            ops.fused_all_gather_matmul(torch.ones(3, 4, device=dev), [torch.ones(4, 2, device=dev)], 0, "no-such-group")
            errors.append(f"rank {rank}: the group name 'no-such-group' was accepted")
        except ValueError as e:
            if "no process group named" not in str(e):
                errors.append(f"rank {rank}: group 'no-such-group': {e}")
        try:
            ops.fused_matmul_reduce_scatter(torch.ones(3, 4, device=dev), torch.ones(4, 2, device=dev), "max", 0, name)
            errors.append(f"rank {rank}: reduce_op 'max' was accepted")
        except ValueError as e:
            if "'sum' or 'avg'" not in str(e):
                errors.append(f"rank {rank}: reduce_op 'max': {e}")
        phase("destroy_process_group")
        dist.destroy_process_group()
        phase("done")
    except Exception:
        errors.append(f"rank {rank}: {traceback.format_exc()}")
    report(results, (rank, errors))
