#pragma once
// The tools' check of a CUDA runtime call: an exception naming the call (the tools link only the
// public library, whose own check is internal).
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace ferry::tools {

inline void cudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace ferry::tools

#define FERRY_TOOL_CUDA(call) ::ferry::tools::cudaCheck((call), #call)
