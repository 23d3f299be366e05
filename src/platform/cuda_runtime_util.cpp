#include "platform/cuda_runtime_util.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "platform/cuda_check.hpp"
#include "ferry/errors.hpp"

namespace ferry {

bool gpuPresent() {
  // pid and answer packed in one word so that readers need no lock: (pid << 1) | present.
  static std::atomic<std::int64_t> cached{-1};
  std::int64_t pid = ::getpid();
  std::int64_t c = cached.load(std::memory_order_acquire);
  if (c >= 0 && (c >> 1) == pid) return (c & 1) != 0;
  int count = 0;
  bool present = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  cached.store((pid << 1) | (present ? 1 : 0), std::memory_order_release);
  return present;
}

int currentDevice() {
  if (!gpuPresent()) throw Error(ErrorCode::NotSupported, "no CUDA device is available to this process");
  int dev = -1;
  FERRY_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

}  // namespace ferry
