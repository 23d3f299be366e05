#pragma once
// Host bytes to device memory, done when the call returns. cudaMemcpy from pageable memory may
// return before its DMA has landed, and cudaMemset of device memory is asynchronous; both are
// ordered only with the legacy stream, and a kernel on a non-blocking stream (PyTorch's, a
// caller's, a proxy's copies) is not. Tables that kernels read from any stream are written here.
#include <cstddef>

namespace ferry {

// @pre the device of `dst` is current.
void uploadNow(void* dst, const void* src, std::size_t bytes);
void zeroNow(void* dst, std::size_t bytes);

}  // namespace ferry
