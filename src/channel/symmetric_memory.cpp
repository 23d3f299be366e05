// SymmetricMemory (symmetric_memory.hpp): the rendezvous that registers, exchanges and maps every
// rank's buffer and signal pad, and the checks before each signal kernel (signal_pad.cu).
#include "ferry/symmetric_memory.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "channel/signal_pad.hpp"
#include "channel/symmetric_put.hpp"
#include "core/deadline.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"
#include "platform/cuda_check.hpp"
#include "platform/device_upload.hpp"
#include "platform/relaxed_capture.hpp"

namespace ferry {

namespace {
constexpr std::size_t kAbortBytes = 16;  // after each signal pad: its abort word, aligned
}  // namespace

struct SymmetricMemory::Impl {
  int device = 0;  // where the signal pad and the pointer tables live
  int rank = 0;
  int worldSize = 0;
  std::size_t bufferBytes = 0;
  std::size_t padBytes = 0;
  std::shared_ptr<void> pad;               // this rank's signal pad, then its abort word (gpuAlloc: zero)
  std::shared_ptr<void> devicePtrs;        // worldSize buffer pointers, then worldSize pad pointers
  std::vector<RegisteredMemory> memories;  // keeps every mapping alive: own and peers', both kinds
  std::vector<void*> buffers;
  std::vector<std::uint32_t*> pads;

  std::string who(const char* operation) const {
    return "rank " + std::to_string(rank) + ": SymmetricMemory " + operation;
  }

  // Rank r's abort word, mapped here: the 4 bytes after its signal pad (kAbortBytes of the pad's
  // allocation and registration), which abort() raises on every rank.
  std::uint32_t* abortWord(int r) const { return pads[static_cast<std::size_t>(r)] + padBytes / 4; }

  void checkRank(const char* operation, const char* role, int r) const {
    if (r < 0 || r >= worldSize)
      throw Error(ErrorCode::InvalidUsage, who(operation) + ": " + role + " rank " + std::to_string(r) +
                                               " is outside [0, " + std::to_string(worldSize) + ")");
  }

  void checkChannel(const char* operation, int channel) const {
    const int channels = static_cast<int>(padBytes / (4 * static_cast<std::size_t>(worldSize)));
    if (channel < 0 || channel >= channels)
      throw Error(ErrorCode::InvalidUsage,
                  who(operation) + ": channel " + std::to_string(channel) + " is outside [0, " +
                      std::to_string(channels) + "): the signal pad of " + std::to_string(padBytes) +
                      " bytes holds 4 bytes per rank and channel (rendezvous with a larger signal pad)");
  }

  void launch(SignalOp op, int peer, int channel, std::chrono::duration<double> timeout,
              cudaStream_t stream) const {
    SignalLaunch s;
    s.pads = static_cast<std::uint32_t* const*>(devicePtrs.get()) + worldSize;
    s.rank = rank;
    s.worldSize = worldSize;
    s.channel = channel;
    s.peer = peer;
    s.op = op;
    s.timeoutNs = timeoutNanoseconds(timeout.count() > 0 ? timeout : env().deviceTimeout);
    s.abortFlag = abortWord(rank);
    launchSignal(s, stream);
  }
};

namespace {

struct Sizes {
  std::uint64_t buffer;
  std::uint64_t pad;
};

// Every rank's sizes, and the same error on every rank where two differ.
void checkSameSizes(Bootstrap& boot, Sizes mine) {
  std::vector<Sizes> all(static_cast<std::size_t>(boot.size()));
  all[static_cast<std::size_t>(boot.rank())] = mine;
  boot.allGather(all.data(), sizeof(Sizes));
  for (int r = 1; r < boot.size(); ++r) {
    const Sizes& a = all[0];
    const Sizes& b = all[static_cast<std::size_t>(r)];
    if (a.buffer != b.buffer || a.pad != b.pad)
      throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(boot.rank()) +
                                               ": SymmetricMemory rendezvous: rank 0 gives a buffer of " +
                                               std::to_string(a.buffer) + " bytes and a signal pad of " +
                                               std::to_string(a.pad) + ", rank " + std::to_string(r) + " " +
                                               std::to_string(b.buffer) + " and " + std::to_string(b.pad) +
                                               " (every rank must allocate the same sizes)");
  }
}

}  // namespace

std::shared_ptr<SymmetricMemory> SymmetricMemory::rendezvous(Communicator& comm, void* buffer,
                                                             std::size_t bytes, std::size_t signalPadBytes,
                                                             int tag) {
  Bootstrap& boot = *comm.bootstrap();
  auto impl = std::make_unique<Impl>();
  impl->rank = boot.rank();
  impl->worldSize = boot.size();
  impl->bufferBytes = bytes;
  impl->padBytes = signalPadBytes;
  const int n = impl->worldSize;
  if (buffer == nullptr || bytes == 0)
    throw Error(ErrorCode::InvalidUsage, impl->who("rendezvous") + ": the buffer is null or empty");
  if (n > 1024)
    throw Error(ErrorCode::NotSupported,
                impl->who("rendezvous") + ": at most 1024 ranks, not " + std::to_string(n));
  if (signalPadBytes % 4 != 0 || signalPadBytes < 4 * static_cast<std::size_t>(n))
    throw Error(ErrorCode::InvalidUsage,
                impl->who("rendezvous") + ": a signal pad of " + std::to_string(signalPadBytes) +
                    " bytes must be a multiple of 4 holding one channel of 4 bytes per rank (at least " +
                    std::to_string(4 * n) + ")");
  checkSameSizes(boot, {bytes, signalPadBytes});
  FERRY_CUDA_CHECK(cudaGetDevice(&impl->device));

  impl->pad = gpuAlloc(signalPadBytes + kAbortBytes);
  const RegisteredMemory mine = comm.registerMemory(buffer, bytes, Transport::CudaIpc);
  const RegisteredMemory myPad =
      comm.registerMemory(impl->pad.get(), signalPadBytes + kAbortBytes, Transport::CudaIpc);
  // Post every send and receive first: one round of bootstrap traffic for all peers.
  std::vector<std::shared_future<RegisteredMemory>> buffers(static_cast<std::size_t>(n)),
      pads(buffers.size());
  for (int peer = 0; peer < n; ++peer) {
    if (peer == impl->rank) continue;
    comm.sendMemory(mine, peer, tag);
    comm.sendMemory(myPad, peer, tag);
  }
  for (int peer = 0; peer < n; ++peer) {
    if (peer == impl->rank) continue;
    buffers[static_cast<std::size_t>(peer)] = comm.recvMemory(peer, tag);
    pads[static_cast<std::size_t>(peer)] = comm.recvMemory(peer, tag);
  }
  for (int peer = 0; peer < n; ++peer) {
    if (peer == impl->rank) {
      impl->memories.push_back(mine);
      impl->memories.push_back(myPad);
    } else {
      impl->memories.push_back(buffers[static_cast<std::size_t>(peer)].get());
      impl->memories.push_back(pads[static_cast<std::size_t>(peer)].get());
    }
    void* b = impl->memories[impl->memories.size() - 2].data();
    void* p = impl->memories.back().data();
    if (b == nullptr || p == nullptr)
      throw Error(
          ErrorCode::InvalidUsage,
          impl->who("rendezvous") + ": rank " + std::to_string(peer) +
              "'s buffer cannot be mapped here (another host, or memory that is neither from gpuAlloc "
              "nor from cudaMalloc): symmetric memory needs every rank on this host");
    impl->buffers.push_back(b);
    impl->pads.push_back(static_cast<std::uint32_t*>(p));
  }
  std::vector<void*> table(impl->buffers);
  table.insert(table.end(), impl->pads.begin(), impl->pads.end());
  impl->devicePtrs = gpuAlloc(table.size() * sizeof(void*));
  uploadNow(impl->devicePtrs.get(), table.data(), table.size() * sizeof(void*));
  // Nobody returns (and signals) before every rank has mapped every pad.
  boot.barrier();
  return std::shared_ptr<SymmetricMemory>(new SymmetricMemory(std::move(impl)));
}

SymmetricMemory::SymmetricMemory(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
// The signal kernels this handle launched may still run (they are asynchronous, and a barrier
// waits for the peers): they read this rank's pad and the peers' mappings, which go with the
// handle, and gpuAlloc memory is freed without waiting for the GPU. So the device finishes first
// (bounded: every wait in those kernels is).
SymmetricMemory::~SymmetricMemory() {
  int previous = -1;
  if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(impl_->device) == cudaSuccess) {
    cudaDeviceSynchronize();
    cudaSetDevice(previous);
  }
}

int SymmetricMemory::rank() const noexcept { return impl_->rank; }
int SymmetricMemory::worldSize() const noexcept { return impl_->worldSize; }
std::size_t SymmetricMemory::bufferBytes() const noexcept { return impl_->bufferBytes; }
std::size_t SymmetricMemory::signalPadBytes() const noexcept { return impl_->padBytes; }
int SymmetricMemory::channels() const noexcept {
  return static_cast<int>(impl_->padBytes / (4 * static_cast<std::size_t>(impl_->worldSize)));
}
const std::vector<void*>& SymmetricMemory::bufferPtrs() const noexcept { return impl_->buffers; }
const std::vector<std::uint32_t*>& SymmetricMemory::signalPadPtrs() const noexcept { return impl_->pads; }
void* const* SymmetricMemory::bufferPtrsDevice() const noexcept {
  return static_cast<void* const*>(impl_->devicePtrs.get());
}
std::uint32_t* const* SymmetricMemory::signalPadPtrsDevice() const noexcept {
  return static_cast<std::uint32_t* const*>(impl_->devicePtrs.get()) + impl_->worldSize;
}

void SymmetricMemory::putSignal(int dstRank, int channel, std::chrono::duration<double> timeout,
                                cudaStream_t stream) const {
  impl_->checkRank("put_signal", "destination", dstRank);
  impl_->checkChannel("put_signal", channel);
  impl_->launch(SignalOp::Put, dstRank, channel, timeout, stream);
}

void SymmetricMemory::waitSignal(int srcRank, int channel, std::chrono::duration<double> timeout,
                                 cudaStream_t stream) const {
  impl_->checkRank("wait_signal", "source", srcRank);
  impl_->checkChannel("wait_signal", channel);
  impl_->launch(SignalOp::Wait, srcRank, channel, timeout, stream);
}

void SymmetricMemory::barrier(int channel, std::chrono::duration<double> timeout, cudaStream_t stream) const {
  impl_->checkChannel("barrier", channel);
  impl_->launch(SignalOp::Barrier, 0, channel, timeout, stream);
}

void SymmetricMemory::abort() const {
  static const std::uint32_t kRaised = 1;
  RelaxedCapture relaxed;  // (another thread may be capturing a graph)
  int previous = -1;
  FERRY_CUDA_CHECK(cudaGetDevice(&previous));
  FERRY_CUDA_CHECK(cudaSetDevice(impl_->device));
  // A stream of its own, which no waiting kernel holds up; the copies go to every rank's word
  // through its mapping here.
  cudaStream_t stream = nullptr;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaError_t err = cudaSuccess;
  for (int r = 0; r < impl_->worldSize && err == cudaSuccess; ++r)
    err = cudaMemcpyAsync(impl_->abortWord(r), &kRaised, sizeof kRaised, cudaMemcpyHostToDevice, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  (void)cudaStreamDestroy(stream);
  (void)cudaSetDevice(previous);
  FERRY_CUDA_CHECK(err);
}

void SymmetricMemory::put(int dstRank, std::size_t dstOffset, const void* src, std::size_t bytes, int blocks,
                          cudaStream_t stream) const {
  impl_->checkRank("put", "destination", dstRank);
  if (dstOffset > impl_->bufferBytes || bytes > impl_->bufferBytes - dstOffset)
    throw Error(ErrorCode::InvalidUsage, impl_->who("put") + ": " + std::to_string(bytes) +
                                             " bytes at byte " + std::to_string(dstOffset) +
                                             " end past the " + std::to_string(impl_->bufferBytes) +
                                             " bytes of rank " + std::to_string(dstRank) + "'s buffer");
  if (blocks < 0 || blocks > kMaxPutBlocks)
    throw Error(ErrorCode::InvalidUsage, impl_->who("put") + ": " + std::to_string(blocks) +
                                             " thread blocks is outside [0, " +
                                             std::to_string(kMaxPutBlocks) + "] (0: the copy engines)");
  if (bytes == 0) return;
  if (src == nullptr)
    throw Error(ErrorCode::InvalidUsage,
                impl_->who("put") + ": the source of " + std::to_string(bytes) + " bytes is null");
  void* dst = static_cast<char*>(impl_->buffers[static_cast<std::size_t>(dstRank)]) + dstOffset;
  if (blocks == 0) {
    FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  launchPut(dst, src, bytes, blocks, stream);
}

}  // namespace ferry
