"""The ranks of test_torch_async_tp.py: a function that all-gathers a shard and multiplies it,
and one that multiplies and reduce-scatters, compiled with ferry.torch.enable_async_tp() on 2
gloo ranks; the compiled graphs must call torch.ops.ferry's fused ops, and the results equal the
product of every rank's seeded inputs."""

import traceback

from rank_processes import report


def run_rank(init_file, rank, n, results):
    errors = []
    try:
        import torch
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol

        import ferry.torch

        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=n)
        group = dist.group.WORLD
        torch._inductor.config.fx_graph_cache = False  # every rank runs the passes, none loads a cached graph
        installed = ferry.torch.enable_async_tp()
        g = torch.Generator().manual_seed(5)
        shards = [torch.randn(8, 16, generator=g) for _ in range(n)]
        B = torch.randn(16, 12, generator=g)
        As = [torch.randn(8 * n, 16, generator=g) for _ in range(n)]

        def gather_then_mm(shard, B):
            return funcol.all_gather_tensor(shard, 0, group) @ B

        def mm_then_scatter(A, B):
            return funcol.reduce_scatter_tensor(A @ B, "sum", 0, group)

        got = torch.compile(gather_then_mm, fullgraph=True)(shards[rank], B)
        want = torch.cat(shards) @ B
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
            errors.append(f"rank {rank}: all_gather -> mm compiled: max error {(got - want).abs().max():.3g}")
        fused_gathers = installed.rewritten
        got = torch.compile(mm_then_scatter, fullgraph=True)(As[rank], B)
        want = sum(A @ B for A in As).chunk(n)[rank]
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            errors.append(f"rank {rank}: mm -> reduce_scatter compiled: max error {(got - want).abs().max():.3g}")
        if (fused_gathers, installed.rewritten - fused_gathers) != (1, 1):
            errors.append(f"rank {rank}: the compiled graphs called ferry's fused ops {fused_gathers} and "
                          f"{installed.rewritten - fused_gathers} times, not once each (did Inductor's "
                          f"micro-pipeline TP pass fuse them?)")
        dist.destroy_process_group()
    except Exception:
        errors.append(f"rank {rank}: {traceback.format_exc()}")
    report(results, (rank, errors))
