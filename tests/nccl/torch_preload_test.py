#!/usr/bin/env python3
"""torch.distributed with the NCCL backend, run twice on the same GPUs: once on the real NCCL, once
with libferry_nccl.so preloaded. Every rank saves what all_reduce, all_gather, reduce_scatter,
all_to_all, broadcast, reduce, a send/recv ring and a few DDP training steps gave; the two runs
must agree (copies exactly, reductions within the tolerance of a different summation order).

    python3 tests/nccl/torch_preload_test.py --lib build-gpu/shims/nccl/libferry_nccl.so [--nproc 4]

Before running anything it checks that the library exports every nccl* function PyTorch's CUDA
library imports: a function left to the real NCCL would receive ferry's communicators and crash.
Exit status 0 only when both runs finish and agree.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def imported_nccl_symbols() -> set[str]:
    """The nccl* functions libtorch_cuda.so (or the NCCL it links) is resolved against."""
    import torch

    lib_dir = Path(torch.__file__).parent / "lib"
    wanted: set[str] = set()
    for lib in lib_dir.glob("libtorch_cuda*.so"):
        out = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True).stdout
        wanted |= {line.split()[-1].split("@")[0] for line in out.splitlines() if " nccl" in line or "\tnccl" in line}
    return {s for s in wanted if s.startswith("nccl")}


def exported_symbols(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()[-1].startswith("nccl")}


def worker(out_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
    results: dict[str, torch.Tensor] = {}

    def rand(n: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(n, generator=gen, device="cuda", dtype=torch.float32).to(dtype)

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for n in (1, 1023, 70001, 1 << 20):
            name = f"{str(dtype).split('.')[-1]}_{n}"
            x = rand(n, dtype)
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.AVG):
                y = x.clone()
                dist.all_reduce(y, op=op)
                results[f"all_reduce_{op}_{name}"] = y
            g = torch.empty(n * world, device="cuda", dtype=dtype)
            dist.all_gather_into_tensor(g, x)
            results[f"all_gather_{name}"] = g
            big = rand(n * world, dtype)
            rs = torch.empty(n, device="cuda", dtype=dtype)
            dist.reduce_scatter_tensor(rs, big)
            results[f"reduce_scatter_{name}"] = rs
            a2a = torch.empty_like(big)
            dist.all_to_all_single(a2a, big)
            results[f"all_to_all_{name}"] = a2a
            b = x.clone()
            dist.broadcast(b, src=world - 1)
            results[f"broadcast_{name}"] = b
            red = x.clone()  # off the root, NCCL leaves the buffer as it was; so must ferry
            dist.reduce(red, dst=world - 1)
            results[f"reduce_{name}"] = red
            got = torch.empty_like(x)
            ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, got, (rank - 1) % world)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            results[f"send_recv_{name}"] = got

    torch.manual_seed(0)  # the same model and data on every rank and in both runs
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.randn(8, 64, 256, generator=torch.Generator().manual_seed(rank)).cuda()
    labels = torch.randint(0, 10, (8, 64), generator=torch.Generator().manual_seed(100 + rank)).cuda()
    losses = []
    for step in range(8):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(data[step]), labels[step])
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    results["ddp_losses"] = torch.stack(losses)
    torch.cuda.synchronize()
    torch.save({k: v.cpu() for k, v in results.items()}, out_dir / f"rank{rank}.pt")
    dist.destroy_process_group()


def run(nproc: int, out_dir: Path, preload: Path | None) -> int:
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    if preload:
        env["LD_PRELOAD"] = f"{preload}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else str(preload)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", __file__, "--worker",
           "--out", str(out_dir)]
    return subprocess.run(cmd, env=env, timeout=900).returncode


def compare(reference: Path, candidate: Path, nproc: int) -> list[str]:
    import torch

    problems = []
    for rank in range(nproc):
        ref, got = torch.load(reference / f"rank{rank}.pt"), torch.load(candidate / f"rank{rank}.pt")
        for key, want in ref.items():
            have = got.get(key)
            if have is None or have.shape != want.shape or have.dtype != want.dtype:
                problems.append(f"rank {rank}: {key}: missing or of another shape/type")
                continue
            exact = not key.startswith(("all_reduce", "reduce_scatter", "reduce_", "ddp"))
            tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}.get(want.dtype, 1e-5)
            ok = torch.equal(have, want) if exact else torch.allclose(have.float(), want.float(), rtol=tol, atol=tol * 4)
            if not ok:
                diff = (have.float() - want.float()).abs().max().item()
                problems.append(f"rank {rank}: {key}: differs from NCCL (max abs difference {diff:g})")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", type=Path, help="libferry_nccl.so")
    parser.add_argument("--nproc", type=int, default=0, help="ranks (default: every GPU)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.out)
        return 0
    import torch

    # What PyTorch imports against what the library exports: checked first, on any machine (a
    # missing function stops the preload before anything runs).
    lib = args.lib.resolve()
    imported = imported_nccl_symbols()
    missing = sorted(imported - exported_symbols(lib))
    if missing:
        print(f"libferry_nccl.so lacks {len(missing)} of the {len(imported)} NCCL functions PyTorch "
              f"{torch.__version__} imports: " + ", ".join(missing))
        return 1
    print(f"libferry_nccl.so exports all {len(imported)} NCCL functions PyTorch {torch.__version__} imports")
    nproc = args.nproc or torch.cuda.device_count()
    if nproc < 2 or torch.cuda.device_count() < nproc:
        print(f"skipped: needs {max(nproc, 2)} GPUs (NCCL refuses ranks that share one), found {torch.cuda.device_count()}")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        ref, cand = Path(tmp, "nccl"), Path(tmp, "ferry")
        ref.mkdir()
        cand.mkdir()
        if run(nproc, ref, None) != 0:
            print("the reference run on the real NCCL failed")
            return 1
        if run(nproc, cand, lib) != 0:
            print("the run with libferry_nccl.so preloaded failed")
            return 1
        problems = compare(ref, cand, nproc)
    for p in problems[:40]:
        print(p)
    print(f"torch.distributed through libferry_nccl.so on {nproc} ranks: "
          f"{'same results as NCCL' if not problems else f'{len(problems)} differences'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
