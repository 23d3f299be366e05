#pragma once
// 8-byte counters for semaphores, carved out of shared allocations: a gpuAlloc chunk is 2 MiB,
// far too much to spend on one counter. Every token keeps its chunk alive; chunks are never
// reused while any token of them lives. Process-wide, one pool per CUDA device plus one for host.
#include <cstdint>
#include <memory>

namespace ferry {

struct Token {
  std::uint64_t* ptr = nullptr;
  std::shared_ptr<void> chunk;  // keeps the memory alive
};

// A zeroed counter on `device` (gpuAlloc memory), or in shareable host memory when device < 0.
Token allocateToken(int device);

}  // namespace ferry
