#pragma once
// Memory that peers on the same host can map. Register it with Communicator::registerMemory and
// send the RegisteredMemory to a peer; the peer gets the same bytes mapped into its own process.
//
// - gpuAlloc: device memory on the current CUDA device from the CUDA virtual memory API (cuMem),
//   exportable as a POSIX file descriptor. A peer maps it through that descriptor, which ferry
//   passes over a Unix-domain socket; no legacy CUDA IPC handle is involved.
// - hostAlloc: host memory backed by a memfd and mapped MAP_SHARED, so that a peer process maps the
//   same pages. When a GPU is present it is also registered with CUDA (cudaHostRegister, portable
//   and mapped), so kernels and copy engines can read and write it.
//
// Both are zeroed, rounded up internally (allocation granularity, page size) and freed when the last
// shared_ptr to them goes (registered memory and peers' mappings keep the pages alive as long as
// they exist: a RegisteredMemory holds a reference; a peer's mapping holds the physical memory).
// Unlike cudaFree, freeing does not wait for the GPU: no kernel or copy may still use the memory
// when its last owner goes.
// Both throw Error(InvalidUsage) for bytes == 0, CudaError / SysError when the allocation fails;
// gpuAlloc throws Error(NotSupported) without a usable CUDA device.
//
// Example:
//   cudaSetDevice(localRank);
//   std::shared_ptr<float> buf = ferry::gpuCallocShared<float>(1 << 20);
//   ferry::RegisteredMemory mem = comm.registerMemory(buf.get(), (1 << 20) * sizeof(float),
//                                                     ferry::Transport::CudaIpc);
//   std::shared_ptr<std::uint64_t> flags = ferry::hostCallocShared<std::uint64_t>(64);
//
// Wrong: registering cudaMalloc memory works (legacy CUDA IPC), but memory from cudaMallocAsync
// pools or from a foreign VMM allocator cannot be exported that way; allocate with gpuAlloc instead.
#include <cstddef>
#include <limits>
#include <memory>

#include "ferry/api.hpp"
#include "ferry/errors.hpp"

namespace ferry {

// @pre a current CUDA device (cudaSetDevice); bytes > 0.
// @post the memory is zero and accessible from the current device (and from every device that has
//       peer access to it); the pointer is aligned to the allocation granularity (2 MiB on Hopper).
FERRY_API std::shared_ptr<void> gpuAlloc(std::size_t bytes);

// @pre bytes > 0. Works without a GPU (then it is plain shared memory, not registered with CUDA).
// @post the memory is zero and page-aligned.
FERRY_API std::shared_ptr<void> hostAlloc(std::size_t bytes);

namespace detail {
template <class T>
std::size_t checkedBytes(std::size_t count) {
  if (count == 0 || count > std::numeric_limits<std::size_t>::max() / sizeof(T))
    throw Error(ErrorCode::InvalidUsage,
                "allocation of " + std::to_string(count) + " elements of " + std::to_string(sizeof(T)) +
                    " bytes: the count must be positive and the size must fit in size_t");
  return count * sizeof(T);
}
}  // namespace detail

// count zeroed elements of T in device memory (gpuAlloc). T must be trivially constructible: no
// constructor or destructor runs.
template <class T>
std::shared_ptr<T> gpuCallocShared(std::size_t count) {
  return std::static_pointer_cast<T>(gpuAlloc(detail::checkedBytes<T>(count)));
}

// count zeroed elements of T in shareable host memory (hostAlloc); no constructor or destructor runs.
template <class T>
std::shared_ptr<T> hostCallocShared(std::size_t count) {
  return std::static_pointer_cast<T>(hostAlloc(detail::checkedBytes<T>(count)));
}

}  // namespace ferry
