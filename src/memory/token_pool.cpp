#include "memory/token_pool.hpp"

#include <map>
#include <mutex>

#include "ferry/memory.hpp"

namespace ferry {
namespace {

constexpr std::size_t kDeviceChunk = 2u << 20;  // the VMM granularity: smaller would round up anyway
constexpr std::size_t kHostChunk = 64u << 10;

struct Pool {
  std::shared_ptr<void> chunk;
  std::size_t used = 0;
  std::size_t capacity = 0;
};

}  // namespace

Token allocateToken(int device) {
  static std::mutex mu;
  static std::map<int, Pool> pools;
  std::lock_guard lock(mu);
  Pool& pool = pools[device < 0 ? -1 : device];
  if (!pool.chunk || pool.used + sizeof(std::uint64_t) > pool.capacity) {
    // gpuAlloc allocates on the current device: semaphores are made with it current.
    pool.capacity = device < 0 ? kHostChunk : kDeviceChunk;
    pool.chunk = device < 0 ? hostAlloc(pool.capacity) : gpuAlloc(pool.capacity);
    pool.used = 0;
  }
  Token t{reinterpret_cast<std::uint64_t*>(static_cast<char*>(pool.chunk.get()) + pool.used), pool.chunk};
  pool.used += sizeof(std::uint64_t);
  return t;
}

}  // namespace ferry
