#pragma once
// Shared by the FIFO and proxy tests: triggers that carry their producer and sequence number in
// fst and a checksum of fst in snd (so a torn trigger, fst of one push with snd of another, is
// caught), and a checker of exactly-once, per-producer-order delivery. The trigger helpers also
// compile for the GPU (tests/gpu/fifo_gpu_test.cu).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "ferry/device/fifo.hpp"
#include "ferry/device/macros.hpp"

namespace ferry::testing {

// Sanitizers slow the many-thread tests down several times; they run fewer pushes there.
inline int scaledCount(int count) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return count / 5;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return count / 5;
#endif
#endif
  return count;
}

FERRY_HOST_DEVICE inline std::uint64_t checksum(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

FERRY_HOST_DEVICE inline ProxyTrigger makeTrigger(int producer, int seq) {
  const std::uint64_t fst = (std::uint64_t(producer) << 32) | std::uint32_t(seq);
  return {fst, checksum(fst)};
}

FERRY_HOST_DEVICE inline int producerOf(const ProxyTrigger& t) { return int(t.fst >> 32); }
FERRY_HOST_DEVICE inline int seqOf(const ProxyTrigger& t) { return int(std::uint32_t(t.fst)); }

// Used by one consumer thread.
class TriggerChecker {
 public:
  TriggerChecker(int producers, int perProducer) : next_(producers, 0), perProducer_(perProducer) {}

  // Returns false (after recording a test failure) for a trigger that is torn, unknown, repeated
  // or out of order. Stops reporting after a few failures, so a broken FIFO does not flood the log.
  bool check(const ProxyTrigger& t) {
    const int p = producerOf(t);
    bool ok = t.snd == checksum(t.fst) && p >= 0 && p < int(next_.size()) && seqOf(t) == next_[p];
    if (ok) {
      ++next_[p];
    } else if (++failures_ <= 5) {
      ADD_FAILURE() << "bad trigger fst=" << std::hex << t.fst << " snd=" << t.snd << std::dec
                    << " (producer " << p << " seq " << seqOf(t) << ", expected seq "
                    << (p >= 0 && p < int(next_.size()) ? next_[p] : -1) << ", snd checksum "
                    << (t.snd == checksum(t.fst) ? "ok" : "WRONG: torn") << ")";
    }
    return ok;
  }

  void expectComplete() const {
    EXPECT_EQ(failures_, 0);
    for (std::size_t p = 0; p < next_.size(); ++p)
      EXPECT_EQ(next_[p], perProducer_) << "producer " << p << ": triggers lost";
  }

 private:
  std::vector<int> next_;
  int perProducer_;
  int failures_ = 0;
};

}  // namespace ferry::testing
