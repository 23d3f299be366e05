#pragma once
// The process-wide registry of memory that ferry allocated (gpuAlloc, hostAlloc). Registration
// asks it whether a pointer is ferry memory (shareable through a file descriptor) or someone
// else's (legacy CUDA IPC, or not shareable at all).
//
// An Allocation is owned by shared_ptrs: the user's (gpuAlloc's result aliases it), and those of
// the RegisteredMemory objects made from it. The registry holds weak references only.
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "memory/fd_server.hpp"
#include "platform/unique_fd.hpp"

namespace ferry {

enum class AllocationKind : std::uint8_t { Device, Host };

struct Allocation {
  AllocationKind kind = AllocationKind::Host;
  std::uint64_t id = 0;         // unique in this process
  FdToken token{};              // random; a peer must present it to get the descriptor
  void* base = nullptr;         // mapped here
  std::size_t size = 0;         // bytes mapped (rounded up to granularity)
  std::size_t granularity = 0;  // device: cuMem allocation granularity; host: page size
  int device = -1;              // owning CUDA device; -1 for host memory

  // Device: the cuMem handle, and the exported POSIX descriptor (made on first shareFd()).
  CUmemGenericAllocationHandle handle = 0;
  bool mapped = false;    // device: cuMemMap done (unmap on destruction)
  bool reserved = false;  // device: VA reserved
  // Host: the memfd; device: the exported descriptor.
  UniqueFd fd;
  bool hostRegistered = false;  // host: cudaHostRegister'ed

  Allocation() = default;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation();  // withdraws it from the fd server, unmaps and frees; never throws

  // Offers the allocation's descriptor on this process's fd server (exporting it first for device
  // memory) and returns the server's name. Idempotent.
  std::string share();
};

// The live ferry allocation that contains ptr, or nullptr. Throws Error(InvalidUsage) when ptr is
// inside one but [ptr, ptr+size) runs past its end.
std::shared_ptr<Allocation> findAllocation(const void* ptr, std::size_t size);

// Number of live ferry allocations in this process (for tests).
std::size_t liveAllocationCount();

}  // namespace ferry
