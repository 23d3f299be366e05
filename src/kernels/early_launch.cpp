#include "kernels/early_launch.hpp"

#include <cuda_runtime_api.h>

#include "platform/cuda_check.hpp"
#include "ferry/env.hpp"

namespace ferry {

bool earlyLaunchWanted() {
  if (!env().launchPdl) return false;
  int device = 0, major = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

}  // namespace ferry
