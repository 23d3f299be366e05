#pragma once
// RegisteredMemory: a buffer plus what a peer needs to map or address it. Made by
// Communicator::registerMemory on the owner, serialized, sent (Communicator::sendMemory), and
// deserialized on a peer (Communicator::recvMemory), where it refers to the same bytes.
//
// What a peer on the SAME host gets from data(), by kind of memory and the transports it was
// registered for:
//   - ferry device memory (gpuAlloc), CudaIpc: the allocation mapped into the peer through a POSIX
//     file descriptor (cuMem VMM), accessible from the peer's current CUDA device at deserialize time.
//   - other device memory (cudaMalloc, PyTorch's caching allocator), CudaIpc: the allocation opened
//     with legacy CUDA IPC (cudaIpcOpenMemHandle, peer access enabled lazily).
//   - ferry host memory (hostAlloc), HostMemory: the same pages mapped MAP_SHARED (and registered
//     with CUDA when the peer has a GPU).
//   - other host memory (malloc, cudaMallocHost): never mappable by a peer: data() is nullptr there.
//     It serves local use and transports that copy (Ethernet, InfiniBand).
// A peer on another host, or memory not registered for the mapping transport above, gives
// data() == nullptr: the descriptor still names the owner, size and transports.
//
// Lifetime: copies share one state. The owner's buffer stays allocated while a local
// RegisteredMemory of it exists (for gpuAlloc/hostAlloc memory; other memory is the caller's to keep
// alive). On a peer, mappings are cached per (owner process, allocation): every RegisteredMemory
// that refers to one allocation shares one mapping, which is released (unmapped, descriptors and
// handles closed) when the last of them goes. The owner must keep its buffer registered until its
// peers have deserialized it; after that the peer's mapping keeps the physical memory alive.
//
// Example (rank 0 shares a buffer with rank 1, both on one host):
//   // rank 0
//   auto buf = ferry::gpuAlloc(bytes);
//   ferry::RegisteredMemory mine = comm.registerMemory(buf.get(), bytes, ferry::Transport::CudaIpc);
//   comm.sendMemory(mine, /*peer=*/1);
//   // rank 1
//   ferry::RegisteredMemory theirs = comm.recvMemory(/*peer=*/0).get();
//   myKernel<<<...>>>(static_cast<float*>(theirs.data()));  // writes rank 0's buffer
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/transport.hpp"

namespace ferry {

enum class MemoryKind : std::uint8_t {
  Host,    // host memory (hostAlloc, malloc, cudaMallocHost)
  Device,  // CUDA device memory (gpuAlloc, cudaMalloc)
};

class FERRY_API RegisteredMemory {
 public:
  // An empty descriptor: valid() is false, data() nullptr, size() 0.
  RegisteredMemory();
  ~RegisteredMemory();
  RegisteredMemory(const RegisteredMemory&);
  RegisteredMemory& operator=(const RegisteredMemory&);
  RegisteredMemory(RegisteredMemory&&) noexcept;
  RegisteredMemory& operator=(RegisteredMemory&&) noexcept;

  bool valid() const noexcept;
  // Owner: the registered pointer. Peer on the same host: the address of the same bytes mapped in
  // this process. nullptr where it cannot be mapped (see above).
  void* data() const noexcept;
  std::size_t size() const noexcept;
  // The rank that registered the memory.
  int rank() const noexcept;
  // True in the process that registered it (also for a copy deserialized there).
  bool isLocal() const noexcept;
  TransportFlags transports() const noexcept;
  MemoryKind kind() const noexcept;
  // The owner's CUDA device; -1 for host memory.
  int device() const noexcept;

  // The wire form, a few hundred bytes at most. It holds a per-allocation random token that lets
  // its holder fetch the allocation's file descriptor from the owner: send it only to peers.
  std::vector<std::byte> serialize() const;
  // Parses a peer's bytes (untrusted input: anything malformed is Error(ProtocolError), never a
  // crash) and maps the memory where it can (see above). Throws TimeoutError naming the owner rank
  // and allocation when the owner does not hand over a descriptor in time (FERRY_FD_TIMEOUT), and
  // CudaError / SysError when mapping fails.
  static RegisteredMemory deserialize(std::span<const std::byte> bytes);

  // For ferry's own code.
  struct Impl;
  explicit RegisteredMemory(std::shared_ptr<Impl> impl);
  const std::shared_ptr<Impl>& impl() const noexcept { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ferry
