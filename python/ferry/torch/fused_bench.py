"""The tensor-parallel fused ops on the Llama 3 shapes, in one run on the local GPUs:

    python -m ferry.torch.fused_bench                      # one rank per GPU (2 at least), bf16 and fp8
    python -m ferry.torch.fused_bench -m 2048,8192 --models 70b --dtypes fp8 --iters 20

For each shape (a layer of Llama 3 8B or 70B cut for tensor parallelism over the ranks, M tokens in
all, in bf16 and in fp8: e4m3 operands with tensor-wise scales through torch._scaled_mm and the
scaled ops, bf16 out) it times, on every rank, the median of `iters` eager calls:
- matmul: the layer's matmul alone (the full A @ B of one rank);
- comm: its collective alone on the ferry backend (all_gather_into_tensor of A's shard, or
  reduce_scatter_tensor of the product), (reg) the same with its tensors registered
  (ferry.torch.register_tensor: zero-copy), and (nccl) the same on the NCCL backend, in microseconds;
  and (a2a, reduce-scatters only) the all-to-all of the product that ferry's composition runs
  instead of a reduce-scatter, on the ferry backend;
- bound: the larger of the matmul and the collective, what a perfect overlap would take;
- ferry: torch.ops.ferry.fused_* on the ferry backend, as shipped: the unfused composition on
  ferry, queued from C++, or the pipelined form where the size table picks it (fused_pipeline.py);
- reg: the same call with FERRY_FUSED_REGISTERED=1 (the composition's collectives on registered
  workspaces, zero-copy: registered_workspace.py);
- pipelined: the same call with FERRY_FUSED_PIPELINE=1 (chunks multiplied as the copy engines bring
  them, on symmetric memory: python/torch_backend/fused_pipeline.cpp on the ferry group);
- pipe sm: the same with FERRY_FUSED_COPY_BLOCKS=SM_BLOCKS too (--sm-blocks; the chunks moved by SM
  stores on that many thread blocks beside the matmul instead of the copy engines);
- unfused: the NCCL backend's collective, then torch.matmul or torch._scaled_mm (or the reverse);
- torch: PyTorch's own torch.ops.symm_mem.fused_* on the NCCL group ("-" where it does not run).
and prints TFLOP/s of each (2 M K N / time), bound / the fastest ferry form (1 is a perfect
overlap) and vs unfused: unfused time / ferry's (as shipped) time (below 1: ferry is slower).
Every shape is checked first: ferry's results (all four forms) against the unfused composition
on NCCL (bf16 products, reduce-scatter summing in float32). The columns are the slowest rank's.
"""

import argparse
import os
import sys

from ferry.torch.bench import init_ferry_and_nccl, local_gpus, run_and_print

# Llama 3: hidden size, MLP size, attention heads, key-value heads, head dim.
MODELS = {
    "8b": (4096, 14336, 32, 8, 128),
    "70b": (8192, 28672, 64, 8, 128),
}


DTYPES = ("bf16", "fp8")


def shapes(models, tp, ms, dtypes=("bf16",)):
    """(model, layer, op, M, K, N, dtype) of the TP layers: 'ag' layers all-gather A's M rows, then
    A @ B with B [K, N] this rank's column shard; 'rs' layers multiply this rank's row shard, A [M, K],
    by B [K, N], then reduce-scatter the M rows. dtype: the operands' (bf16, or fp8 with scales)."""
    out = []
    for dtype in dtypes:
        for name in models:
            hidden, mlp, heads, kv, hd = MODELS[name]
            for m in ms:
                out.append((name, "qkv", "ag", m, hidden, (heads + 2 * kv) * hd // tp, dtype))
                out.append((name, "attn_out", "rs", m, heads * hd // tp, hidden, dtype))
                out.append((name, "mlp_up_gate", "ag", m, hidden, 2 * mlp // tp, dtype))
                out.append((name, "mlp_down", "rs", m, mlp // tp, hidden, dtype))
    return out


def _with_env(name, call, **more):
    """call() with the environment variable `name` at 1, and each of `more` at its value (the fused
    ops read their opt-ins per call); the environment as it was afterwards."""
    values = {name: "1", **{k: str(v) for k, v in more.items()}}
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        return call()
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _median_us(call, iters, torch):
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    times.sort()
    return times[len(times) // 2]


def _forms(torch, dist, op, dtype, m, k, nn, n, dev, g, ferry_group, nccl_group):
    """The calls one shape times, as closures over its tensors: the matmul alone, the collective
    alone (comm(group)), the composition's all-to-all (exchange, reduce-scatters only), the ferry op,
    the unfused composition on NCCL, PyTorch's op, and the reference the forms are checked against.
    bf16: torch.matmul. fp8: e4m3 operands with tensor-wise scales through torch._scaled_mm, bf16
    out (the scaled ops); gathers move the fp8 bytes."""
    name, nccl_name = ferry_group.group_name, nccl_group.group_name
    if dtype == "fp8":
        e4m3 = torch.float8_e4m3fn
        one = torch.ones((), device=dev, dtype=torch.float32)
        b_scale = torch.full((), k**-0.5, device=dev, dtype=torch.float32)
        B = torch.randn(nn, k, device=dev, generator=g).to(e4m3).t()  # column-major, as _scaled_mm takes it

        def mm(X):
            return torch._scaled_mm(X, B, one, b_scale, out_dtype=torch.bfloat16)

        def randn(*shape):
            return torch.randn(*shape, device=dev, generator=g).to(e4m3)
    else:
        B = torch.randn(k, nn, device=dev, dtype=torch.bfloat16, generator=g) / k**0.5

        def mm(X):
            return X @ B

        def randn(*shape):
            return torch.randn(*shape, device=dev, dtype=torch.bfloat16, generator=g)

    def as_bytes(t):  # what a gather moves; NCCL and gloo need not know fp8
        return t.view(torch.uint8) if t.element_size() == 1 else t

    f = {"exchange": None}
    if op == "ag":
        shard, full = randn(m // n, k), randn(m, k)

        def comm(group=ferry_group):
            dist.all_gather_into_tensor(as_bytes(full), as_bytes(shard), group=group)

        if dtype == "fp8":
            def fused():
                return torch.ops.ferry.fused_all_gather_scaled_matmul(
                    shard, [B], one, [b_scale], 0, name, [None], [None], [torch.bfloat16], [False])[1][0]

            def theirs():
                return torch.ops.symm_mem.fused_all_gather_scaled_matmul(
                    shard, [B], one, [b_scale], 0, nccl_name, [None], [None], [torch.bfloat16], [False])[1][0]
        else:
            def fused():
                return torch.ops.ferry.fused_all_gather_matmul(shard, [B], 0, name)[1][0]

            def theirs():
                return torch.ops.symm_mem.fused_all_gather_matmul(shard, [B], 0, nccl_name)[1][0]

        def unfused():
            comm(nccl_group)
            return mm(full)

        f.update(matmul=lambda: mm(full), comm=comm, comm_tensors=(full, shard), fused=fused, theirs=theirs,
                 unfused=unfused, reference=lambda: unfused().float())
    else:
        A = randn(m, k)
        product = mm(A)
        part = torch.empty(m // n, nn, device=dev, dtype=torch.bfloat16)

        def comm(group=ferry_group):
            dist.reduce_scatter_tensor(part, product, group=group)

        wire = product.view(-1).view(torch.uint8)
        received = torch.empty_like(wire)

        def exchange():  # the composition's collective: the product's rows by all-to-all
            dist.all_to_all_single(received, wire, group=ferry_group)

        if dtype == "fp8":
            # The product's shape: PyTorch's op takes len() of it (a None raised TypeError on 4 H200).
            shape = [m, nn]

            def fused():
                return torch.ops.ferry.fused_scaled_matmul_reduce_scatter(
                    A, B, one, b_scale, "sum", 0, 0, name, shape, out_dtype=torch.bfloat16)

            def theirs():
                return torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
                    A, B, one, b_scale, "sum", 0, 0, nccl_name, shape, out_dtype=torch.bfloat16)
        else:
            def fused():
                return torch.ops.ferry.fused_matmul_reduce_scatter(A, B, "sum", 0, name)

            def theirs():
                return torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, nccl_name)

        def unfused():
            dist.reduce_scatter_tensor(part, mm(A), group=nccl_group)
            return part

        def reference():
            # What the fused op computes by contract: each rank's bf16 product, summed in float32.
            # A float32 product instead differs by the products' bf16 rounding, which cancelling
            # sums leave above any fixed tolerance at a few of 4M elements.
            out = torch.empty(m // n, nn, device=dev, dtype=torch.float32)
            dist.reduce_scatter_tensor(out, mm(A).float(), group=nccl_group)
            return out

        f.update(matmul=lambda: mm(A), comm=comm, comm_tensors=(product, part), exchange=exchange, fused=fused,
                 theirs=theirs, unfused=unfused, reference=reference)
    return f


def _rank(init_file, rank, n, rows, iters, sm_blocks, results):
    try:
        import torch
        import torch.distributed as dist

        import ferry.torch as ferry_torch

        dev, ferry_group, nccl_group = init_ferry_and_nccl(init_file, rank, n, timeout_s=600)
        try:
            import torch.distributed._symmetric_memory as torch_symm

            torch_symm.enable_symm_mem_for_group(nccl_group.group_name)
        except Exception:  # noqa: BLE001  (torch's fused ops are then reported as not run)
            torch_symm = None
        out = []
        for i, (model, layer, op, m, k, nn, dtype) in enumerate(rows):
            if rank == 0:  # progress, so that a long run (or one that fails) shows where it is
                print(f"fused_bench: {i + 1}/{len(rows)} {model} {layer} {dtype} M={m}", file=sys.stderr, flush=True)
            g = torch.Generator(device=dev).manual_seed(1000 * rank + m)
            f = _forms(torch, dist, op, dtype, m, k, nn, n, dev, g, ferry_group, nccl_group)
            fused, comm, exchange, theirs = f["fused"], f["comm"], f["exchange"], f["theirs"]
            matmul, unfused, reference, comm_tensors = f["matmul"], f["unfused"], f["reference"], f["comm_tensors"]

            def pipelined(fused=fused):  # on the copy engines, whatever the caller's environment says
                return _with_env("FERRY_FUSED_PIPELINE", fused, FERRY_FUSED_COPY_BLOCKS=0)

            def registered(fused=fused):
                return _with_env("FERRY_FUSED_REGISTERED", fused)

            def pipelined_sm(fused=fused):
                return _with_env("FERRY_FUSED_PIPELINE", fused, FERRY_FUSED_COPY_BLOCKS=sm_blocks)

            # Every rank calls every form whatever the verdicts: they are collectives.
            want = reference()
            forms = (("ferry", fused), ("registered", registered), ("pipelined", pipelined),
                     ("pipelined_sm", pipelined_sm))
            wrong = [name for name, f in forms if not torch.allclose(f().float(), want, rtol=2e-2, atol=2e-2)]
            row = {"wrong": wrong, "matmul": _median_us(matmul, iters, torch), "comm": _median_us(comm, iters, torch),
                   "nccl_comm": _median_us(lambda: comm(nccl_group), iters, torch),
                   "ferry": _median_us(fused, iters, torch), "registered": _median_us(registered, iters, torch),
                   "pipelined": _median_us(pipelined, iters, torch),
                   "pipelined_sm": _median_us(pipelined_sm, iters, torch),
                   "unfused": _median_us(unfused, iters, torch), "torch": None,
                   "a2a": None if exchange is None else _median_us(exchange, iters, torch)}
            # The collective alone again, its tensors registered with the ferry group (zero-copy):
            # what the composition's collective could take without staging.
            with ferry_torch.register_tensor(comm_tensors[0], ferry_group), \
                    ferry_torch.register_tensor(comm_tensors[1], ferry_group):
                row["comm_registered"] = _median_us(comm, iters, torch)
            if torch_symm is not None:
                try:
                    row["torch"] = _median_us(theirs, iters, torch)
                except Exception as e:  # noqa: BLE001  (not every torch runs its fused ops everywhere)
                    row["torch_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            dist.barrier()
            out.append(row)
        dist.destroy_process_group()
        results.put((rank, out, None))
    except BaseException:  # noqa: BLE001  (reported by the parent)
        import traceback

        results.put((rank, None, traceback.format_exc()))
    results.close()
    results.join_thread()
    os._exit(0)


def table(rows, per_rank, n, device_name):
    """The printed table: per shape, the slowest rank's times as TFLOP/s."""
    lines = [f"# fused tensor-parallel ops, {n} ranks, one per GPU ({device_name}); TFLOP/s "
             f"(2 M K N / time, the slowest rank's); bound = max(matmul, comm); bound/best (best: the fastest "
             f"ferry form) 1.00 is a perfect overlap",
             f"{'model':>6} {'layer':>12} {'op':>3} {'dtype':>5} {'M':>6} {'K':>6} {'N':>6} {'matmul':>8} "
             f"{'comm us':>8} {'reg us':>8} {'nccl us':>8} {'a2a us':>8} {'bound':>8} {'ferry':>8} {'reg':>8} "
             f"{'pipelined':>9} {'pipe sm':>8} {'unfused':>8} {'torch':>8} {'bound/best':>10} {'vs unfused':>10} "
             f"{'check':>6}"]
    bad = False
    for i, (model, layer, op, m, k, nn, dtype) in enumerate(rows):
        rs = [per_rank[r][i] for r in range(n)]

        def worst(key, rs=rs):
            vals = [r.get(key) for r in rs]
            return None if any(v is None for v in vals) else max(vals)

        flops = 2.0 * m * k * nn
        tf = lambda us: "-" if us is None else f"{flops / us / 1e6:.1f}"  # noqa: E731  (TFLOP/s from us)
        us = lambda t: "-" if t is None else f"{t:.1f}"  # noqa: E731
        mm, cm, fe, fr, pi = worst("matmul"), worst("comm"), worst("ferry"), worst("registered"), worst("pipelined")
        ps = worst("pipelined_sm")
        bound = max(mm, cm)
        wrong = sorted({w for r in rs for w in r["wrong"]})
        bad |= bool(wrong)
        lines.append(f"{model:>6} {layer:>12} {op:>3} {dtype:>5} {m:>6} {k:>6} {nn:>6} {tf(mm):>8} {cm:>8.1f} "
                     f"{worst('comm_registered'):>8.1f} {worst('nccl_comm'):>8.1f} {us(worst('a2a')):>8} {tf(bound):>8} "
                     f"{tf(fe):>8} {tf(fr):>8} {tf(pi):>9} {tf(ps):>8} {tf(worst('unfused')):>8} "
                     f"{tf(worst('torch')):>8} "
                     f"{bound / min(fe, fr, pi, ps):>10.2f} {worst('unfused') / fe:>10.2f} "
                     f"{'WRONG: ' + ','.join(wrong) if wrong else 'ok':>6}")
    errors = {r.get("torch_error") for rr in per_rank.values() for r in rr if r.get("torch_error")}
    for e in sorted(errors):
        lines.append(f"# torch's fused op did not run: {e}")
    return lines, bad


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ferry.torch.fused_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--tokens", default="256,1024,4096,16384", help="M values, comma-separated")
    p.add_argument("--models", default="8b,70b", help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--dtypes", default="bf16,fp8", help="comma-separated: " + ", ".join(DTYPES))
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--sm-blocks", type=int, default=32,
                   help="thread blocks of the 'pipe sm' form's copies (FERRY_FUSED_COPY_BLOCKS), 1 to 1024")
    a = p.parse_args(argv)
    if not 1 <= a.sm_blocks <= 1024:
        p.error(f"--sm-blocks {a.sm_blocks} is outside [1, 1024]")
    torch, n = local_gpus("python -m ferry.torch.fused_bench", "tensor parallelism 2 at least")
    if torch is None:
        return n
    models = [x for x in a.models.split(",") if x]
    unknown = [x for x in models if x not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}: choose from {list(MODELS)}")
    dtypes = [x for x in a.dtypes.split(",") if x]
    if any(x not in DTYPES for x in dtypes):
        p.error(f"unknown dtype(s) in {dtypes}: choose from {list(DTYPES)}")
    rows = shapes(models, n, [int(x) for x in a.tokens.split(",") if x], dtypes)
    return run_and_print(_rank, n, (rows, a.iters, a.sm_blocks), 3600,
                         lambda per_rank: table(rows, per_rank, n, torch.cuda.get_device_name(0)))


if __name__ == "__main__":
    sys.exit(main())
