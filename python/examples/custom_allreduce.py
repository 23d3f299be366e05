"""A native kernel on ferry's channels, written in CUDA C++ inside this file, compiled at run time
with CuPy against ferry's device headers, and checked against Comm.all_reduce, under torchrun:

    torchrun --nproc-per-node 2 python/examples/custom_allreduce.py

Each rank puts its input into its slot of every peer's scratch buffer through a MemoryChannel (the
GPU stores straight into the peer's memory over NVLink), signals, waits for every peer's signal,
and sums the slots.
"""

import os

import cupy
import torch

import ferry

KERNEL = r"""
#include "ferry/device/memory_channel.hpp"

extern "C" __global__ void one_shot_allreduce(ferry::MemoryChannelDeviceHandle* channels, const int* peers,
                                              int npeers, int rank, const float* in, const float* scratch,
                                              float* out, unsigned long long n) {
  // 1. My input into slot `rank` of each peer's scratch (channel p's dst is peer p's scratch).
  for (int p = 0; p < npeers; ++p) {
    ferry::MemoryChannelDeviceHandle c = channels[p];
    c.put(rank * n * sizeof(float), 0, n * sizeof(float), threadIdx.x, blockDim.x);
  }
  __syncthreads();  // every thread's stores, before the signals (semaphore.hpp's ordering contract)
  // 2. One thread per peer: tell it, then wait until it told us.
  if (threadIdx.x < npeers) {
    ferry::MemoryChannelDeviceHandle c = channels[threadIdx.x];
    c.signal();
    c.wait();
  }
  __syncthreads();
  // 3. Sum: my input and every peer's slot in my scratch.
  for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {
    float acc = in[i];
    for (int p = 0; p < npeers; ++p) acc += scratch[peers[p] * n + i];
    out[i] = acc;
  }
}
"""


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()  # ranks may share a GPU
    torch.cuda.set_device(local_rank)
    cupy.cuda.Device(local_rank).use()
    comm = ferry.Comm()
    rank, n_ranks, peers = comm.rank, comm.world_size, [p for p in range(comm.world_size) if p != comm.rank]
    n = 1 << 16
    nbytes = n * 4

    # Buffers every peer maps: gpu_alloc memory, registered for CUDA IPC.
    inp, scratch = ferry.gpu_alloc(nbytes), ferry.gpu_alloc(nbytes * n_ranks)
    com = comm.communicator  # the Comm's own Communicator; tags below 0x1000 are the program's
    cuda_ipc = ferry.Transport.cuda_ipc
    my_scratch = com.register_memory(scratch.address, scratch.nbytes, cuda_ipc)
    for p in peers:
        com.send_memory(my_scratch, p, tag=1)
    theirs = {p: com.recv_memory(p, tag=1) for p in peers}
    conns = {p: com.connect(p, cuda_ipc, tag=2) for p in peers}
    channels = []
    for p in peers:
        sem = ferry.MemoryDevice2DeviceSemaphore(com, conns[p].get(), tag=3)
        channels.append(ferry.MemoryChannel(sem, theirs[p].get(), inp.address))
    keep = channels  # the channels own their semaphores: keep them while kernels run

    # The handles go to the GPU as the bytes of their C++ structs.
    handles = cupy.asarray(bytearray(b"".join(c.device_handle() for c in channels)), dtype=cupy.uint8)
    peer_ranks = cupy.asarray(peers, dtype=cupy.int32)
    module = cupy.RawModule(code=KERNEL, backend="nvcc",
                            options=(f"-I{ferry.include_dir()}", "-std=c++20", "--expt-relaxed-constexpr"))
    kernel = module.get_function("one_shot_allreduce")

    x = torch.randn(n, device="cuda", generator=torch.Generator("cuda").manual_seed(rank))
    cupy.cuda.runtime.memcpy(inp.address, x.data_ptr(), nbytes, cupy.cuda.runtime.memcpyDeviceToDevice)
    out = cupy.full(n, float("nan"), dtype=cupy.float32)
    torch.cuda.synchronize()
    kernel((1,), (512,), (handles, peer_ranks, cupy.int32(len(peers)), cupy.int32(rank),
                          cupy.uint64(inp.address), cupy.uint64(scratch.address), out, cupy.uint64(n)))
    cupy.cuda.Device().synchronize()

    want = x.clone()
    comm.all_reduce(want)
    torch.cuda.synchronize()
    got = torch.as_tensor(out, device="cuda")
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    if rank == 0:
        print(f"custom one-shot allreduce on ferry MemoryChannels: matches Comm.all_reduce on {n_ranks} ranks")
    del keep


if __name__ == "__main__":
    main()
