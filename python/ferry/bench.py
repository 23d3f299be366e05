"""Per-call cost of ferry.Comm.all_reduce on torch tensors, on the local GPUs.

    python -m ferry.bench                      # one rank per GPU (2 ranks sharing one GPU if only one)
    python -m ferry.bench -n 4 -b 1K -e 64M --iters 200

For each size it prints, per call, the time for the call to return to Python (host), measured three
ways: through ferry.Comm on a tensor, through the extension on raw addresses (the same C++ call
without the Python layer), and the difference, which is what the Python layer adds; then the GPU
time per call of the same all-reduce replayed from a CUDA graph (a graph holds only the kernels, so
the Python layer adds nothing there). Every result is checked before its time is printed.
"""

import argparse
import multiprocessing
import os
import sys
import time


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    factor = units.get(t[-1:], 1)
    value = float(t[:-1] if t[-1:] in units else t)
    if not (value >= 1 and value * factor < 1 << 40):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size between 1 and 1T bytes")
    return int(value * factor)


def _host_us(call, iters, torch):
    """Median over 5 samples of the time `iters` back-to-back calls take to return, per call."""
    samples = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        samples.append((time.perf_counter() - start) / iters * 1e6)
    torch.cuda.synchronize()
    return sorted(samples)[len(samples) // 2]


def graph_us(call, iters, torch):
    """GPU time per call of `iters` calls of call() captured in one CUDA graph and replayed (the
    first call of a shape runs outside the capture: selection, pointer checks). ferry.torch.bench
    uses it too."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(iters):
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3 / iters


def _rank(uid, rank, n, sizes, iters, results):
    import torch

    import ferry

    torch.cuda.set_device(rank % torch.cuda.device_count())
    comm = ferry.Comm(ferry.TcpBootstrap.create(uid, rank, n))
    rows = []
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        x = torch.full((count,), float(rank + 1), device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        address = x.data_ptr()

        def through_python():
            comm.all_reduce(x)

        def through_extension():
            comm._native.all_reduce(address, address, count, ferry.DataType.float32, ferry.ReduceOp.sum, stream)

        tensor_us = _host_us(through_python, iters, torch)
        raw_us = _host_us(through_extension, iters, torch)
        graphed_us = graph_us(lambda: comm.all_reduce(x), iters, torch)
        # Check: after k calls of all_reduce in place, every element is (sum of rank+1) * n^(k-1).
        x.fill_(float(rank + 1))
        comm.all_reduce(x)
        torch.cuda.synchronize()
        ok = bool(torch.all(x == float(n * (n + 1) // 2)))
        rows.append((nbytes, tensor_us, raw_us, graphed_us, ok))
    results.put((rank, rows))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ferry.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--ranks", type=int, default=0, help="ranks (default: one per GPU, at least 2)")
    parser.add_argument("-b", "--begin", type=parse_size, default=parse_size("1K"))
    parser.add_argument("-e", "--end", type=parse_size, default=parse_size("64M"))
    parser.add_argument("-f", "--factor", type=int, default=4)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("python -m ferry.bench: needs torch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("python -m ferry.bench: no GPU here; nothing to measure")
        return 0
    import ferry

    ferry.require_native()
    n = args.ranks or max(2, torch.cuda.device_count())
    sizes, s = [], args.begin
    while s <= args.end:
        sizes.append(s)
        s *= max(2, args.factor)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # architecture.md rule 1, for anything NCCL here
    uid = ferry.UniqueId.create()
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(uid, r, n, sizes, args.iters, results)) for r in range(n)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=1800) for _ in range(n))
    for p in procs:
        p.join()
    print(f"# ferry.Comm.all_reduce, float32, in place, {n} ranks on {torch.cuda.device_count()} GPU(s); "
          f"microseconds per call, the slowest rank's; host: until the call returns to Python")
    print(f"{'bytes':>12} {'host tensor':>12} {'host addr':>10} {'python adds':>12} {'graph gpu':>10}  check")
    bad = False
    for i, nbytes in enumerate(sizes):
        rows = [got[r][i] for r in range(n)]
        tensor_us = max(r[1] for r in rows)
        raw_us = max(r[2] for r in rows)
        graphed_us = max(r[3] for r in rows)
        ok = all(r[4] for r in rows)
        bad |= not ok
        print(f"{nbytes:>12} {tensor_us:>12.2f} {raw_us:>10.2f} {tensor_us - raw_us:>12.2f} {graphed_us:>10.2f}  "
              f"{'ok' if ok else 'WRONG'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
