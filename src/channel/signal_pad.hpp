#pragma once
// The kernels behind SymmetricMemory's putSignal, waitSignal and barrier (symmetric_memory.hpp):
// one block on the caller's stream, each thread serving one peer.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry {

enum class SignalOp : std::uint8_t { Put, Wait, Barrier };

struct SignalLaunch {
  std::uint32_t* const* pads = nullptr;  // device array: every rank's signal pad, mapped here
  int rank = 0;
  int worldSize = 0;
  int channel = 0;
  int peer = 0;  // Put: the destination; Wait: the source; Barrier: unused (every other rank)
  SignalOp op = SignalOp::Put;
  std::uint64_t timeoutNs = 0;
  const std::uint32_t* abortFlag = nullptr;  // this rank's abort word: raised, every wait gives up
};

// @pre the pads and the channel are valid (SymmetricMemory checks them first).
void launchSignal(const SignalLaunch& launch, cudaStream_t stream);

}  // namespace ferry
