// The FIFO with host memory, host threads as producers and the test as the consumer: sizes, the
// trigger format (full bit), poll/pop, many producers through a small FIFO (exactly once, in
// per-producer order, no torn triggers), and bounded waits that abort naming the operation.
#include "ferry/fifo.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "expect_contains.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "fifo_test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

FifoOptions hostOptions(int size) {
  FifoOptions o;
  o.size = size;
  o.memory = FifoMemory::Host;
  return o;
}

TEST(Fifo, DefaultsAndHandle) {
  Fifo fifo(hostOptions(FifoOptions::kDefaultSize));
  EXPECT_EQ(fifo.size(), 512);
  EXPECT_EQ(fifo.memory(), FifoMemory::Host);
  EXPECT_EQ(fifo.device(), -1);
  EXPECT_EQ(fifo.tail(), 0u);
  FifoDeviceHandle h = fifo.deviceHandle();
  EXPECT_EQ(h.size, 512);
  ASSERT_NE(h.triggers, nullptr);
  ASSERT_NE(h.head, nullptr);
  ASSERT_NE(h.tail, nullptr);
  ASSERT_NE(h.tailCache, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(h.triggers) % 16, 0u);
  // The default bound is FERRY_DEVICE_TIMEOUT (30 s unless the environment says otherwise).
  EXPECT_EQ(h.wait.timeoutNs, static_cast<std::uint64_t>(env().deviceTimeout.count() * 1e9));
  EXPECT_FALSE(fifo.poll());
}

TEST(Fifo, TimeoutAndRankComeFromOptions) {
  FifoOptions o = hostOptions(4);
  o.rank = 3;
  o.timeout = 5ms;
  FifoDeviceHandle h = Fifo(o).deviceHandle();
  EXPECT_EQ(h.wait.rank, 3);
  EXPECT_EQ(h.wait.timeoutNs, 5'000'000u);
  o.timeout = 0ms;
  EXPECT_EQ(Fifo(o).deviceHandle().wait.timeoutNs, 0u);  // 0: never time out
}

class FifoBadSize : public ::testing::TestWithParam<int> {};

TEST_P(FifoBadSize, IsInvalidUsage) {
  try {
    Fifo fifo(hostOptions(GetParam()));
    ADD_FAILURE() << "size " << GetParam() << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_CONTAINS(e.what(), "size " + std::to_string(GetParam()));
    EXPECT_CONTAINS(e.what(), "power of two");
  }
}
INSTANTIATE_TEST_SUITE_P(Sizes, FifoBadSize,
                         ::testing::Values(0, -1, -16, 3, 12, 513, FifoOptions::kMaxSize * 2,
                                           FifoOptions::kMaxSize + 1));

TEST(Fifo, GoodSizesWork) {
  EXPECT_EQ(Fifo(hostOptions(FifoOptions::kMaxSize)).size(), FifoOptions::kMaxSize);
  for (int size : {1, 2, 16, 512, 4096}) {
    Fifo fifo(hostOptions(size));
    FifoDeviceHandle h = fifo.deviceHandle();
    // Fill it completely twice over, so that every slot is reused.
    for (int round = 0; round < 2; ++round) {
      for (int i = 0; i < size; ++i)
        EXPECT_EQ(h.push({std::uint64_t(i), ~std::uint64_t(i)}), std::uint64_t(round * size + i));
      for (int i = 0; i < size; ++i) {
        auto t = fifo.poll();
        ASSERT_TRUE(t) << "size " << size << " slot " << i;
        EXPECT_EQ(t->fst, std::uint64_t(i));
        EXPECT_EQ(t->snd, ~std::uint64_t(i));
        fifo.pop();
      }
      EXPECT_FALSE(fifo.poll());
    }
  }
}

TEST(Fifo, NegativeTimeoutIsInvalidUsage) {
  FifoOptions o = hostOptions(4);
  o.timeout = -1ms;
  EXPECT_THROW(Fifo{o}, Error);
}

TEST(Fifo, PollDoesNotAdvanceAndPopDoes) {
  Fifo fifo(hostOptions(4));
  FifoDeviceHandle h = fifo.deviceHandle();
  EXPECT_EQ(h.push({7, 8}), 0u);
  EXPECT_EQ(h.push({9, 10}), 1u);
  for (int i = 0; i < 3; ++i) {
    auto t = fifo.poll();
    ASSERT_TRUE(t);
    EXPECT_EQ(t->fst, 7u);
    EXPECT_EQ(t->snd, 8u);
  }
  fifo.pop();
  EXPECT_EQ(fifo.tail(), 1u);
  EXPECT_EQ(*h.tail, 1u);
  auto t = fifo.poll();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->fst, 9u);
  fifo.pop();
  EXPECT_FALSE(fifo.poll());
  // A popped slot is cleared before the tail moves.
  EXPECT_EQ(h.triggers[0].fst, 0u);
  EXPECT_EQ(h.triggers[1].fst, 0u);
}

TEST(Fifo, TheFullBitIsTheFifosAndEveryOtherBitTheUsers) {
  Fifo fifo(hostOptions(4));
  FifoDeviceHandle h = fifo.deviceHandle();
  const std::uint64_t userBits = ~kTriggerFullBit;
  h.push({userBits, ~std::uint64_t{0}});  // all 127 user bits set
  h.push({0, 0});                         // a zero trigger is still a trigger
  h.push({kTriggerFullBit | 5, 6});       // the top bit of fst is not the user's: it comes back clear
  auto t = fifo.poll();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->fst, userBits);
  EXPECT_EQ(t->snd, ~std::uint64_t{0});
  fifo.pop();
  t = fifo.poll();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->fst, 0u);
  EXPECT_EQ(t->snd, 0u);
  fifo.pop();
  t = fifo.poll();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->fst, 5u);
  fifo.pop();
}

TEST(Fifo, PopWithoutTriggerIsInvalidUsage) {
  Fifo fifo(hostOptions(4));
  try {
    fifo.pop();
    ADD_FAILURE() << "pop on an empty FIFO was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_CONTAINS(e.what(), "Fifo::pop");
  }
  EXPECT_EQ(fifo.tail(), 0u);
}

TEST(Fifo, SyncReturnsOncePopped) {
  Fifo fifo(hostOptions(4));
  FifoDeviceHandle h = fifo.deviceHandle();
  const std::uint64_t slot = h.push({1, 2});
  std::atomic<bool> synced{false};
  std::thread producer([&] {
    h.sync(slot);
    synced = true;
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(synced.load()) << "sync returned before the trigger was popped";
  ASSERT_TRUE(fifo.poll());
  fifo.pop();
  producer.join();
  EXPECT_TRUE(synced.load());
}

// Many producers, a FIFO of 16 slots (full most of the time), the test thread as consumer.
TEST(Fifo, ManyProducersExactlyOnceInOrderNoTornTriggers) {
  constexpr int kProducers = 8;
  const int perProducer = testing::scaledCount(100'000);
  FifoOptions o = hostOptions(16);
  o.timeout = 30s;  // a generous bound: a hang fails the test instead of running forever
  Fifo fifo(o);
  FifoDeviceHandle h = fifo.deviceHandle();
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([h, p, perProducer] {
      for (int i = 0; i < perProducer; ++i) h.push(testing::makeTrigger(p, i));
    });
  testing::TriggerChecker checker(kProducers, perProducer);
  auto lastProgress = std::chrono::steady_clock::now();
  for (std::uint64_t done = 0; done < std::uint64_t(kProducers) * perProducer;) {
    auto t = fifo.poll();
    if (!t) {
      // A lost trigger leaves its slot empty forever: fail instead of hanging (producers blocked
      // behind it abort when their push times out).
      if (std::chrono::steady_clock::now() - lastProgress > 20s) {
        ADD_FAILURE() << "no trigger at slot " << fifo.tail() << " for 20 s";
        break;
      }
      std::this_thread::yield();
      continue;
    }
    lastProgress = std::chrono::steady_clock::now();
    checker.check(*t);
    fifo.pop();
    ++done;
  }
  for (auto& t : producers) t.join();
  EXPECT_FALSE(fifo.poll());
  EXPECT_EQ(fifo.tail(), std::uint64_t(kProducers) * perProducer);
  EXPECT_EQ(*h.head, fifo.tail());
  checker.expectComplete();
}

// Bounded waits abort the process with a report that names the operation and the slot.
using FifoDeathTest = ::testing::Test;

TEST(FifoDeathTest, PushIntoAFullFifoTimesOut) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FifoOptions o = hostOptions(4);
  o.rank = 2;
  o.timeout = 20ms;
  Fifo fifo(o);
  FifoDeviceHandle h = fifo.deviceHandle();
  for (int i = 0; i < 4; ++i) h.push({1, 1});
  EXPECT_DEATH(h.push({1, 1}), "rank 2: Fifo::push waiting for rank -1 timed out after 20 ms \\(detail 4\\)");
}

TEST(FifoDeathTest, SyncOnAnUnhandledTriggerTimesOut) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  FifoOptions o = hostOptions(4);
  o.timeout = 20ms;
  Fifo fifo(o);
  FifoDeviceHandle h = fifo.deviceHandle();
  h.push({1, 1});
  const std::uint64_t slot = h.push({1, 1});
  ASSERT_TRUE(fifo.poll());
  fifo.pop();  // slot 0 is handled, slot 1 never is
  h.sync(0);
  EXPECT_DEATH(h.sync(slot), "Fifo::sync waiting for rank -1 timed out.*\\(detail 1\\)");
}

TEST(Fifo, GpuMemoryWithoutAGpuIsACudaError) {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) GTEST_SKIP() << "a GPU is present";
  (void)cudaGetLastError();
  FifoOptions o;
  o.memory = FifoMemory::Gpu;
  EXPECT_THROW(Fifo{o}, CudaError);
}

}  // namespace
}  // namespace ferry
