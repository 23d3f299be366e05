"""A native algorithm of your own: a CUDA C++ kernel inside this file, compiled at run time with
CuPy against ferry's device headers, running on ferry's channels, added to the Comm as one of its
all-reduce algorithms and checked against the built-in ones, under torchrun:

    torchrun --nproc-per-node 2 python/examples/custom_allreduce.py

The kernel is a one-shot allreduce: each rank puts its input into its slot of every peer's scratch
buffer through a MemoryChannel (the GPU stores straight into the peer's memory over NVLink),
signals, waits for every peer's signal, sums the slots, then signals and waits once more so that no
rank's next call overwrites a slot a peer is still reading.
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
  // 1. My input (the channels' source buffer) into slot `rank` of each peer's scratch.
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
  // 4. Every rank has read its slots: the next call may write them again.
  __syncthreads();
  if (threadIdx.x < npeers) {
    ferry::MemoryChannelDeviceHandle c = channels[threadIdx.x];
    c.signal();
    c.wait();
  }
}
"""

MAX_ELEMENTS = 1 << 16


class OneShotAllReduce(ferry.NativeAlgorithm):
    """float32 sums of up to MAX_ELEMENTS elements, in one thread block."""

    def name(self):
        return "example_one_shot"

    def collective(self):
        return ferry.Collective.all_reduce

    def constraints(self):
        return f"float32 sum, up to {MAX_ELEMENTS} elements"

    def setup(self, comm):
        # Collective (every rank runs it when the algorithm is added): buffers every peer maps, and
        # a MemoryChannel to each peer whose destination is the peer's scratch.
        rank, n_ranks = comm.rank, comm.world_size
        self.rank, self.peers = rank, [p for p in range(n_ranks) if p != rank]
        nbytes = MAX_ELEMENTS * 4
        self.inp, self.scratch = ferry.gpu_alloc(nbytes), ferry.gpu_alloc(nbytes * n_ranks)
        com = comm.communicator  # the Comm's own Communicator; tags below 0x1000 are the program's
        cuda_ipc = ferry.Transport.cuda_ipc
        my_scratch = com.register_memory(self.scratch.address, self.scratch.nbytes, cuda_ipc)
        for p in self.peers:
            com.send_memory(my_scratch, p, tag=1)
        theirs = {p: com.recv_memory(p, tag=1) for p in self.peers}
        conns = {p: com.connect(p, cuda_ipc, tag=2) for p in self.peers}
        self.channels = []  # kept: the channels own their semaphores
        for p in self.peers:
            sem = ferry.MemoryDevice2DeviceSemaphore(com, conns[p].get(), tag=3)
            self.channels.append(ferry.MemoryChannel(sem, theirs[p].get(), self.inp.address))
        # The handles go to the GPU as the bytes of their C++ structs.
        raw = b"".join(c.device_handle() for c in self.channels)
        self.handles = cupy.asarray(bytearray(raw), dtype=cupy.uint8)
        self.peer_ranks = cupy.asarray(self.peers, dtype=cupy.int32)
        module = cupy.RawModule(code=KERNEL, backend="nvcc",
                                options=(f"-I{ferry.include_dir()}", "-std=c++20", "--expt-relaxed-constexpr"))
        self.kernel = module.get_function("one_shot_allreduce")

    def why_not(self, call):
        if call.dtype != ferry.DataType.float32 or call.op != ferry.ReduceOp.sum:
            return "float32 sums only"
        return "" if call.count <= MAX_ELEMENTS else f"more than {MAX_ELEMENTS} elements"

    def launch(self, call):
        # Everything on the call's stream: the input into the channels' source buffer, the kernel.
        nbytes = call.count * 4
        cupy.cuda.runtime.memcpyAsync(self.inp.address, call.send, nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, call.stream)
        with cupy.cuda.ExternalStream(call.stream):
            self.kernel((1,), (512,), (self.handles, self.peer_ranks, cupy.int32(len(self.peers)),
                                       cupy.int32(self.rank), cupy.uint64(self.inp.address),
                                       cupy.uint64(self.scratch.address), cupy.uint64(call.recv),
                                       cupy.uint64(call.count)))


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()  # ranks may share a GPU
    torch.cuda.set_device(local_rank)
    cupy.cuda.Device(local_rank).use()
    comm = ferry.Comm()
    rank, n_ranks = comm.rank, comm.world_size
    name = comm.add_algorithm(OneShotAllReduce())
    listed = {a.name: a for a in comm.algorithms()}
    assert listed[name].kind == "native", listed[name]

    gen = torch.Generator("cuda").manual_seed(1234 + rank)
    for count in (1, 1000, 4097, MAX_ELEMENTS):  # several calls: the slots are reused each time
        x = torch.randn(count, device="cuda", generator=gen)
        got = torch.full_like(x, float("nan"))  # poisoned: every element must be written
        comm.set_algorithm("all_reduce", name)
        comm.all_reduce(x, out=got)
        want = torch.full_like(x, float("nan"))
        comm.set_algorithm("all_reduce", "allreduce_ll")  # a built-in algorithm as the reference
        comm.all_reduce(x, out=want)
        torch.cuda.synchronize()
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (count, (got - want).abs().max())
    comm.set_algorithm("all_reduce", "")
    # A shape it refuses goes to the built-in algorithms.
    assert comm.algorithm_for("all_reduce", 4 * MAX_ELEMENTS * 2) != name
    if rank == 0:
        print(f"{name}: a CuPy kernel on ferry MemoryChannels, added to the Comm, matches allreduce_ll "
              f"on {n_ranks} ranks")


if __name__ == "__main__":
    main()
