#pragma once
// Whether a call's buffer is device memory of the Comm's GPU, as cheaply as the check mode allows
// (FERRY_CHECK_POINTERS):
//   cached  (default) CUDA is asked the first time a pointer of an allocation is seen, and the
//           allocation's range is remembered (per thread, a few ranges): the calls of a training
//           or serving loop, which reuse their buffers, ask CUDA nothing
//   always  CUDA is asked on every call (as NCCL with NCCL_CHECK_POINTERS=1)
//   never   only the cheap checks of validateCall (null, alignment, overlap); a bad pointer then
//           faults in the kernel, as with NCCL's default
// A stream being captured is never asked about (a capture must not see calls it could object to).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace ferry {

// Empty when [p, p + bytes) may be used on `device` by a call on `stream`; otherwise what it is
// ("host memory or another GPU's?"), for the caller's error.
std::string whyNotDeviceMemory(const void* p, std::uint64_t bytes, int device, cudaStream_t stream);

}  // namespace ferry
