"""The tensor-parallel fused ops on the Llama 3 shapes, in one run on the local GPUs:

    python -m ferry.torch.fused_bench                      # one rank per GPU (2 at least), bf16
    python -m ferry.torch.fused_bench -m 2048,8192 --models 70b --iters 20

For each shape (a layer of Llama 3 8B or 70B cut for tensor parallelism over the ranks, M tokens in
all) it times, on every rank, the median of `iters` eager calls:
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
- pipelined: the same call with FERRY_FUSED_PIPELINE=1 (fused_pipeline.py: chunks multiplied as the
  copy engine brings them, on symmetric memory);
- unfused: the NCCL backend's collective, then torch.matmul (or the reverse);
- torch: PyTorch's own torch.ops.symm_mem.fused_* on the NCCL group ("-" where it does not run).
and prints TFLOP/s of each (2 M K N / time), bound / the fastest ferry form (1 is a perfect
overlap) and vs unfused: unfused time / ferry's (as shipped) time (below 1: ferry is slower). Every shape is checked first: ferry's results (all three forms) against the unfused
composition on NCCL (bf16 products, reduce-scatter summing in float32). The columns are the
slowest rank's.
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


def shapes(models, tp, ms):
    """(model, layer, op, M, K, N) of the TP layers: 'ag' layers all-gather A's M rows, then A @ B
    with B [K, N] this rank's column shard; 'rs' layers multiply this rank's row shard, A [M, K],
    by B [K, N], then reduce-scatter the M rows."""
    out = []
    for name in models:
        hidden, mlp, heads, kv, hd = MODELS[name]
        for m in ms:
            out.append((name, "qkv", "ag", m, hidden, (heads + 2 * kv) * hd // tp))
            out.append((name, "attn_out", "rs", m, heads * hd // tp, hidden))
            out.append((name, "mlp_up_gate", "ag", m, hidden, 2 * mlp // tp))
            out.append((name, "mlp_down", "rs", m, mlp // tp, hidden))
    return out


def _with_env(name, call):
    """call() with the environment variable `name` at 1 (the fused ops read their opt-ins per call)."""
    os.environ[name] = "1"
    try:
        return call()
    finally:
        os.environ.pop(name)


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


def _rank(init_file, rank, n, rows, iters, results):
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
        for i, (model, layer, op, m, k, nn) in enumerate(rows):
            if rank == 0:  # progress, so that a long run (or one that fails) shows where it is
                print(f"fused_bench: {i + 1}/{len(rows)} {model} {layer} M={m}", file=sys.stderr, flush=True)
            g = torch.Generator(device=dev).manual_seed(1000 * rank + m)
            B = torch.randn(k, nn, device=dev, dtype=torch.bfloat16, generator=g) / k**0.5
            if op == "ag":
                shard = torch.randn(m // n, k, device=dev, dtype=torch.bfloat16, generator=g)
                full = torch.empty(m, k, device=dev, dtype=torch.bfloat16)

                def matmul():
                    return full @ B

                def comm(group=ferry_group):
                    dist.all_gather_into_tensor(full, shard, group=group)

                comm_tensors = (full, shard)
                exchange = None

                def fused():
                    return torch.ops.ferry.fused_all_gather_matmul(shard, [B], 0, ferry_group.group_name)[1][0]

                def unfused():
                    dist.all_gather_into_tensor(full, shard, group=nccl_group)
                    return full @ B

                def theirs():
                    return torch.ops.symm_mem.fused_all_gather_matmul(shard, [B], 0, nccl_group.group_name)[1][0]

                def reference():
                    dist.all_gather_into_tensor(full, shard, group=nccl_group)
                    return (full @ B).float()
            else:
                A = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=g)
                product = A @ B
                part = torch.empty(m // n, nn, device=dev, dtype=torch.bfloat16)

                def matmul():
                    return A @ B

                def comm(group=ferry_group):
                    dist.reduce_scatter_tensor(part, product, group=group)

                comm_tensors = (product, part)
                wire = product.view(-1).view(torch.uint8)
                received = torch.empty_like(wire)

                def exchange():  # the composition's collective: the product's rows by all-to-all
                    dist.all_to_all_single(received, wire, group=ferry_group)

                def fused():
                    return torch.ops.ferry.fused_matmul_reduce_scatter(A, B, "sum", 0, ferry_group.group_name)

                def unfused():
                    dist.reduce_scatter_tensor(part, A @ B, group=nccl_group)
                    return part

                def theirs():
                    return torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, nccl_group.group_name)

                def reference():
                    # What the fused op computes by contract: each rank's bf16 product, summed in
                    # float32. A float32 product instead differs by the products' bf16 rounding, which
                    # cancelling sums leave above any fixed tolerance at a few of 4M elements.
                    out = torch.empty(m // n, nn, device=dev, dtype=torch.float32)
                    dist.reduce_scatter_tensor(out, (A @ B).float(), group=nccl_group)
                    return out

            def pipelined(fused=fused):
                return _with_env("FERRY_FUSED_PIPELINE", fused)

            def registered(fused=fused):
                return _with_env("FERRY_FUSED_REGISTERED", fused)

            # Every rank calls every form whatever the verdicts: they are collectives.
            want = reference()
            wrong = [name for name, f in (("ferry", fused), ("registered", registered), ("pipelined", pipelined))
                     if not torch.allclose(f().float(), want, rtol=2e-2, atol=2e-2)]
            row = {"wrong": wrong, "matmul": _median_us(matmul, iters, torch), "comm": _median_us(comm, iters, torch),
                   "nccl_comm": _median_us(lambda: comm(nccl_group), iters, torch),
                   "ferry": _median_us(fused, iters, torch), "registered": _median_us(registered, iters, torch),
                   "pipelined": _median_us(pipelined, iters, torch),
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
    lines = [f"# fused tensor-parallel ops, bf16, {n} ranks, one per GPU ({device_name}); TFLOP/s "
             f"(2 M K N / time, the slowest rank's); bound = max(matmul, comm); bound/best (best: the fastest ferry form) 1.00 is a perfect overlap",
             f"{'model':>6} {'layer':>12} {'op':>3} {'M':>6} {'K':>6} {'N':>6} {'matmul':>8} {'comm us':>8} "
             f"{'reg us':>8} {'nccl us':>8} {'a2a us':>8} {'bound':>8} {'ferry':>8} {'reg':>8} {'pipelined':>9} {'unfused':>8} {'torch':>8} {'bound/best':>10} "
             f"{'vs unfused':>10} {'check':>6}"]
    bad = False
    for i, (model, layer, op, m, k, nn) in enumerate(rows):
        rs = [per_rank[r][i] for r in range(n)]

        def worst(key, rs=rs):
            vals = [r.get(key) for r in rs]
            return None if any(v is None for v in vals) else max(vals)

        flops = 2.0 * m * k * nn
        tf = lambda us: "-" if us is None else f"{flops / us / 1e6:.1f}"  # noqa: E731  (TFLOP/s from us)
        us = lambda t: "-" if t is None else f"{t:.1f}"  # noqa: E731
        mm, cm, fe, fr, pi = worst("matmul"), worst("comm"), worst("ferry"), worst("registered"), worst("pipelined")
        bound = max(mm, cm)
        wrong = sorted({w for r in rs for w in r["wrong"]})
        bad |= bool(wrong)
        lines.append(f"{model:>6} {layer:>12} {op:>3} {m:>6} {k:>6} {nn:>6} {tf(mm):>8} {cm:>8.1f} {worst('comm_registered'):>8.1f} {worst('nccl_comm'):>8.1f} {us(worst('a2a')):>8} {tf(bound):>8} "
                     f"{tf(fe):>8} {tf(fr):>8} {tf(pi):>9} {tf(worst('unfused')):>8} {tf(worst('torch')):>8} "
                     f"{bound / min(fe, fr, pi):>10.2f} {worst('unfused') / fe:>10.2f} "
                     f"{'WRONG: ' + ','.join(wrong) if wrong else 'ok':>6}")
    errors = {r.get("torch_error") for rr in per_rank.values() for r in rr if r.get("torch_error")}
    for e in sorted(errors):
        lines.append(f"# torch's fused op did not run: {e}")
    return lines, bad


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ferry.torch.fused_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--tokens", default="256,1024,4096,16384", help="M values, comma-separated")
    p.add_argument("--models", default="8b,70b", help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--iters", type=int, default=10)
    a = p.parse_args(argv)
    torch, n = local_gpus("python -m ferry.torch.fused_bench", "tensor parallelism 2 at least")
    if torch is None:
        return n
    models = [x for x in a.models.split(",") if x]
    unknown = [x for x in models if x not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}: choose from {list(MODELS)}")
    rows = shapes(models, n, [int(x) for x in a.tokens.split(",") if x])
    return run_and_print(_rank, n, (rows, a.iters), 3600,
                         lambda per_rank: table(rows, per_rank, n, torch.cuda.get_device_name(0)))


if __name__ == "__main__":
    sys.exit(main())
