#pragma once
// What the Connection tests between processes share (tests/mp): rounds of writes of random sizes
// (1 byte, the whole buffer, unaligned offsets) that both ranks derive alike, the bytes each round
// writes, and a bounded wait for a signalled word.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ferry/errors.hpp"

namespace ferry::test {

struct WriteOp {
  std::size_t dstOff, srcOff, bytes;
};

// The same sequence on every rank: round 0 writes 1 byte, round 1 a whole source buffer at offset
// 0, the others random sizes (every third one small) at random offsets.
inline std::vector<WriteOp> writeRounds(std::size_t dstSize, std::size_t srcSize, int rounds) {
  std::mt19937_64 rng(2024);
  std::vector<WriteOp> out;
  for (int r = 0; r < rounds; ++r) {
    const std::size_t maxBytes = std::min(dstSize, srcSize);
    const std::size_t bytes = r == 0 ? 1 : r == 1 ? maxBytes : 1 + rng() % (r % 3 == 0 ? 64 : maxBytes);
    const std::size_t dstOff = r == 1 ? 0 : rng() % (dstSize - bytes + 1);
    const std::size_t srcOff = r == 1 ? 0 : rng() % (srcSize - bytes + 1);
    out.push_back({dstOff, srcOff, bytes});
  }
  return out;
}

// Byte i of what round `round` writes.
inline std::byte patternByte(std::uint64_t round, std::size_t i) {
  std::uint64_t x = (round << 40) ^ i;
  x *= 0x9e3779b97f4a7c15ull;
  return static_cast<std::byte>(x >> 57);
}

// The sender's side of a round: its source bytes.
inline void fillRound(std::byte* src, int round, const WriteOp& op) {
  for (std::size_t i = 0; i < op.bytes; ++i) src[op.srcOff + i] = patternByte(round, i);
}

// The receiver's side: what its buffer must hold after the rounds so far.
class ShadowBuffer {
 public:
  explicit ShadowBuffer(std::size_t bytes) : bytes_(bytes, std::byte{0}) {}
  void apply(int round, const WriteOp& op) {
    for (std::size_t i = 0; i < op.bytes; ++i) bytes_[op.dstOff + i] = patternByte(round, i);
  }
  // The first byte of `buffer` that differs, or size() if none does.
  std::size_t firstWrong(const std::byte* buffer) const {
    for (std::size_t i = 0; i < bytes_.size(); ++i)
      if (buffer[i] != bytes_[i]) return i;
    return bytes_.size();
  }
  std::size_t size() const { return bytes_.size(); }

 private:
  std::vector<std::byte> bytes_;
};

// Waits (20 s at most) until *word >= value, reading with acquire.
inline void waitWord(const std::uint64_t* word, std::uint64_t value, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::atomic_ref<const std::uint64_t>(*word).load(std::memory_order_acquire) < value) {
    if (std::chrono::steady_clock::now() > deadline)
      throw TimeoutError(std::string(what) + ": never reached " + std::to_string(value));
    std::this_thread::yield();
  }
}

}  // namespace ferry::test
