#pragma once
// Makes a CUDA device current for one scope and restores the caller's afterwards (only where it
// had to switch): the proxy, the FIFO, the connections and the Comm work for a device of their own
// on threads that may have another current.
//
//   { DeviceGuard guard(device_); cudaMemcpyAsync(...); }
#include <cuda_runtime_api.h>

#include "platform/cuda_check.hpp"

namespace ferry {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    FERRY_CUDA_CHECK(cudaGetDevice(&previous_));
    switched_ = previous_ != device;
    if (switched_) FERRY_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace ferry
