"""dist.all_reduce on the ferry backend beside the NCCL backend, in one run on the local GPUs.

    python -m ferry.torch.bench                 # one rank per GPU (needs 2 GPUs at least)
    python -m ferry.torch.bench -b 1K -e 1G -f 4 --iters 100

The ranks join one default group "cpu:gloo,cuda:ferry" and a second group on "nccl"; for each size
and each backend it prints the GPU time per call of a synchronous dist.all_reduce (float32, in
place) issued eagerly from Python, the same replayed from a CUDA graph, and the host time for the
eager call to return (what the backend adds on the CPU); on ferry also the eager call with the
tensor registered (ferry.torch.register_tensor: zero-copy). Each time is the median of 5 runs of
back-to-back calls. Ratios are NCCL's time over ferry's (above 1: ferry is faster). Every size is
checked on both backends before it is timed.
"""

import argparse
import faulthandler
import multiprocessing
import os
import queue
import signal
import statistics
import sys
import tempfile
import time

from ferry.bench import graph_us, parse_size


def _iters_for(nbytes, iters):
    return max(5, min(iters, (1 << 32) // max(nbytes, 1)))


SAMPLES = 5


def _timed(call, iters, torch, samples=SAMPLES):
    """GPU time per call of `iters` back-to-back calls, and the host time per call to issue them:
    the medians of `samples` such runs, as ferry-bench takes. Eager calls are bound by the host, so
    one run can catch a pause of the process (on 2 H100, with one run per size, ferry's eager 1 MiB
    took 38 us per call where 256 KiB and 4 MiB took 20 and 25)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    gpu, cpu = [], []
    for _ in range(samples):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host = time.perf_counter()
        start.record()
        for _ in range(iters):
            call()
        stop.record()
        host = time.perf_counter() - host
        stop.synchronize()
        gpu.append(start.elapsed_time(stop) * 1e3 / iters)
        cpu.append(host * 1e6 / iters)
    return statistics.median(gpu), statistics.median(cpu)


def init_ferry_and_nccl(init_file, rank, n, timeout_s):
    """A benchmark rank's groups, on GPU `rank`: the default group "cpu:gloo,cuda:ferry" and a
    second on NCCL, to time the same calls on both. Returns (device, ferry group, NCCL group).
    ferry.torch.fused_bench uses it too."""
    import datetime

    import torch
    import torch.distributed as dist

    import ferry.torch  # noqa: F401  (registers "ferry")

    torch.cuda.set_device(rank)
    # Not bound to the device (device_id): torch 2.11 would then hand ferry's backend to the new
    # NCCL group below as the group to split from (docs/pytorch.md).
    dist.init_process_group("cpu:gloo,cuda:ferry", init_method=f"file://{init_file}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return torch.device("cuda", rank), dist.group.WORLD, dist.new_group(backend="nccl")


def _rank(init_file, rank, n, sizes, iters, results):
    try:
        import torch
        import torch.distributed as dist

        import ferry.torch as ferry_torch

        dev, ferry_group, nccl_group = init_ferry_and_nccl(init_file, rank, n, timeout_s=300)
        groups = {"ferry": ferry_group, "nccl": nccl_group}
        rows = []
        for nbytes in sizes:
            x = torch.empty(max(1, nbytes // 4), device=dev)
            it = _iters_for(nbytes, iters)
            row = {"bytes": nbytes}
            for name, group in groups.items():
                x.fill_(float(rank + 1))
                dist.all_reduce(x, group=group)
                torch.cuda.synchronize()
                row[name + "_ok"] = bool(torch.all(x == float(n * (n + 1) // 2)))
                x.zero_()  # sums of zeros stay finite however many calls run

                def call(group=group):
                    dist.all_reduce(x, group=group)

                dist.barrier()
                row[name + "_eager"], row[name + "_host"] = _timed(call, it, torch)
                dist.barrier()
                row[name + "_graph"] = graph_us(call, it, torch)
            # The same on ferry with x registered (ferry.torch.register_tensor): zero-copy.
            with ferry_torch.register_tensor(x, ferry_group):
                x.fill_(float(rank + 1))
                dist.all_reduce(x, group=ferry_group)
                torch.cuda.synchronize()
                row["ferry_ok"] &= bool(torch.all(x == float(n * (n + 1) // 2)))
                x.zero_()
                dist.barrier()
                row["registered_eager"], _ = _timed(lambda: dist.all_reduce(x, group=ferry_group), it, torch)
                torch.cuda.synchronize()
            rows.append(row)
            del x
        dist.destroy_process_group()
        results.put((rank, rows, None))
    except BaseException:  # noqa: BLE001 - reported by the parent
        import traceback

        results.put((rank, None, traceback.format_exc()))
    results.close()
    results.join_thread()
    os._exit(0)


def _traced_rank(target, *args):
    """A rank's process: SIGUSR1 prints where every thread of it stands (run_gpu_ranks sends it to
    the others when one rank fails, so that a rank stuck elsewhere says where)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    target(*args)


def run_gpu_ranks(target, n, args, timeout):
    """Spawns n ranks running target(init_file, rank, n, *args, results), each of which puts
    (rank, rows, traceback or None) on `results`; returns {rank: rows}, or None after printing the
    first rank's failure, then the stacks of the others (SIGUSR1), and killing them.
    ferry.torch.fused_bench uses it too."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_traced_rank, args=(target, os.path.join(d, "init"), r, n, *args, results))
                 for r in range(n)]
        for p in procs:
            p.start()
        got = {}
        for _ in range(n):
            try:
                rank, rows, error = results.get(timeout=timeout)
            except queue.Empty:
                rank, rows, error = None, None, f"no rank reported within {timeout} s"
            if error:
                print(f"rank {rank} failed:\n{error}", file=sys.stderr)
                reported = {rank}
                try:  # the other ranks' reports, failures included, that come within a few seconds
                    while True:
                        other, _, other_error = results.get(timeout=5)
                        reported.add(other)
                        if other_error:
                            print(f"rank {other} failed too:\n{other_error}", file=sys.stderr)
                except queue.Empty:
                    pass
                for r, p in enumerate(procs):
                    if r not in reported and p.is_alive():
                        print(f"--- where rank {r} stands:", file=sys.stderr, flush=True)
                        os.kill(p.pid, signal.SIGUSR1)
                        time.sleep(1)
                for p in procs:
                    p.kill()
                return None
            got[rank] = rows
        for p in procs:
            p.join()
    return got


def run_and_print(target, n, args, timeout, table_of):
    """run_gpu_ranks, then prints table_of(rows by rank) -> (lines, bad); the exit status: 1 if a
    rank failed or a check did, else 0. ferry.torch.fused_bench uses it too."""
    got = run_gpu_ranks(target, n, args, timeout)
    if got is None:
        return 1
    lines, bad = table_of(got)
    print("\n".join(lines))
    return 1 if bad else 0


def table(sizes, got, n, device_name):
    """The printed table from the ranks' rows ({rank: rows}): per size, the slowest rank's times.
    Returns (lines, whether any check failed)."""
    lines = [f"# dist.all_reduce, float32, in place, synchronous: {n} ranks, one per GPU ({device_name}); "
             f"microseconds per call, the slowest rank's",
             "# eager: issued from Python back to back (GPU time per call); reg: the same with the tensor registered "
             "(ferry.torch.register_tensor); graph: replayed from a CUDA graph; host: until the eager call returns; "
             "ratio: nccl / ferry"]
    cols = ["bytes", "ferry eager", "nccl eager", "ratio", "ferry reg", "ratio", "ferry graph", "nccl graph",
            "ratio", "ferry host", "nccl host", "check"]
    lines.append(" ".join(f"{c:>12}" for c in cols))
    bad = False
    for i, nbytes in enumerate(sizes):
        rows = [got[r][i] for r in range(n)]

        def worst(key, rows=rows):
            return max(r[key] for r in rows)

        ok = all(r["ferry_ok"] and r["nccl_ok"] for r in rows)
        bad |= not ok
        fe, ne, fr, fg, ng = (worst(k) for k in ("ferry_eager", "nccl_eager", "registered_eager", "ferry_graph",
                                                  "nccl_graph"))
        cells = [f"{nbytes:>12}", f"{fe:>12.2f}", f"{ne:>12.2f}", f"{ne / fe:>12.2f}", f"{fr:>12.2f}",
                 f"{ne / fr:>12.2f}", f"{fg:>12.2f}", f"{ng:>12.2f}", f"{ng / fg:>12.2f}",
                 f"{worst('ferry_host'):>12.2f}", f"{worst('nccl_host'):>12.2f}", f"{'ok' if ok else 'WRONG':>12}"]
        lines.append(" ".join(cells))
    return lines, bad


def local_gpus(prog, why_two):
    """(torch, the number of local GPUs) for a torch benchmark, with NVLink multicast kept off in
    everything it starts (architecture.md rule 1, NCCL's and PyTorch's included); or (None, exit
    status) after saying why there is nothing to run: no torch (2), fewer than 2 GPUs (0)."""
    try:
        import torch
    except ImportError:
        print(f"{prog}: needs torch", file=sys.stderr)
        return None, 2
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        print(f"{prog}: {n} GPU(s) here; the NCCL backend needs one GPU per rank and {why_two}: nothing to measure")
        return None, 0
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    return torch, n


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ferry.torch.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("-b", "--begin", type=parse_size, default=parse_size("1K"))
    parser.add_argument("-e", "--end", type=parse_size, default=parse_size("1G"))
    parser.add_argument("-f", "--factor", type=int, default=4)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args(argv)
    torch, n = local_gpus("python -m ferry.torch.bench", "the comparison needs 2 at least")
    if torch is None:
        return n
    sizes, s = [], args.begin
    while s <= args.end:
        sizes.append(s)
        s *= max(2, args.factor)
    return run_and_print(_rank, n, (sizes, args.iters), 1800,
                         lambda got: table(sizes, got, n, torch.cuda.get_device_name(0)))


if __name__ == "__main__":
    sys.exit(main())
