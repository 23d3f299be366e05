"""What each rank of test_torch_training.py runs: a small seeded transformer trained with DDP and
with FSDP2 (fully_shard) on a torch.distributed backend, and, on rank 0, the same model trained in
one process on the whole batch. Each rank puts its loss curves (one loss per step, the mean over
the whole batch) on the queue."""

import os
import sys
import traceback

D, HEADS, LAYERS, SEQ, PER_RANK = 64, 4, 2, 16, 4


def _model(torch):
    torch.manual_seed(1234)
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, dim_feedforward=4 * D, dropout=0.0, batch_first=True)
    return torch.nn.Sequential(torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False),
                               torch.nn.Linear(D, 1))


def _batch(torch, step, n, dev):
    """The whole batch of a step (n * PER_RANK samples), the same on every rank."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(n * PER_RANK, SEQ, D, generator=g)
    y = torch.randn(n * PER_RANK, SEQ, 1, generator=g)
    return x.to(dev), y.to(dev)


def _train(torch, model, steps, n, part, dev, all_reduce_loss):
    """`steps` SGD steps on this process's `part` (a slice) of each whole batch of n ranks."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        x, y = _batch(torch, step, n, dev)
        loss = torch.nn.functional.mse_loss(model(x[part]), y[part])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(all_reduce_loss(loss.detach()))
    return losses


def run_rank(init_file, rank, n, backend, steps, results):
    try:
        import datetime
        import faulthandler

        faulthandler.dump_traceback_later(330, exit=True)  # a hang prints every thread's stack
        import torch
        import torch.distributed as dist

        import ferry.torch  # noqa: F401  (registers "ferry")

        torch.cuda.set_device(rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dist.init_process_group(f"cpu:gloo,cuda:{backend}", init_method=f"file://{init_file}", rank=rank,
                                world_size=n, timeout=datetime.timedelta(seconds=120), device_id=dev)

        def mean_loss(loss):
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
            return loss.item()

        curves = {}
        ddp = torch.nn.parallel.DistributedDataParallel(_model(torch).to(dev), device_ids=[dev.index])
        mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        curves["ddp"] = _train(torch, ddp, steps, n, mine, dev, mean_loss)
        print(f"[training rank {rank}] {backend}: DDP done, loss {curves['ddp'][0]:.4f} -> {curves['ddp'][-1]:.4f}",
              file=sys.stderr, flush=True)
        from torch.distributed.fsdp import fully_shard

        model = _model(torch).to(dev)
        for layer in model[0].layers:
            fully_shard(layer)
        fully_shard(model)
        curves["fsdp2"] = _train(torch, model, steps, n, mine, dev, mean_loss)
        print(f"[training rank {rank}] {backend}: FSDP2 done, loss {curves['fsdp2'][0]:.4f} -> "
              f"{curves['fsdp2'][-1]:.4f}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        if rank == 0:
            # The reference: one process, the whole batch (the mean over it is the ranks' mean).
            curves["single"] = _train(torch, _model(torch).to(dev), steps, n, slice(None), dev, lambda loss: loss.item())
        # Whether the NCCL API this process called was ferry's (libferry_nccl.so preloaded and mapped).
        with open("/proc/self/maps") as maps:
            curves["libferry_nccl"] = any("libferry_nccl" in line for line in maps)
        results.put((rank, curves, None))
    except BaseException:  # reported to the parent, which fails the test
        print(f"[training rank {rank}] FAILED: {traceback.format_exc()}", file=sys.stderr, flush=True)
        results.put((rank, None, traceback.format_exc()))
    results.close()
    results.join_thread()
    sys.stdout.flush()
    os._exit(0)
