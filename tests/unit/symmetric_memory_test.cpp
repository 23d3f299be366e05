// SymmetricMemory's checks that come before any CUDA call (include/ferry/symmetric_memory.hpp):
// without a GPU, a bad buffer or signal pad is an InvalidUsage error naming the rank and the call.
// What needs GPUs (mapping, signals) is tested by python/tests/test_torch_symm.py.
#include <gtest/gtest.h>

#include <memory>

#include "ferry/communicator.hpp"
#include "ferry/symmetric_memory.hpp"
#include "unit/expect_contains.hpp"
#include "unit/fake_bootstrap.hpp"
#include "unit/invalid_usage.hpp"

namespace ferry {
namespace {

using ::ferry::testing::invalidUsageOf;

TEST(SymmetricMemory, ABadBufferOrSignalPadIsRefusedBeforeAnythingIsMapped) {
  auto hub = std::make_shared<test::FakeBootstrap::Hub>();
  Communicator comm(std::make_shared<test::FakeBootstrap>(hub, 0, 1));
  char byte = 0;
  EXPECT_CONTAINS(invalidUsageOf([&] { SymmetricMemory::rendezvous(comm, nullptr, 64); }),
                  "rank 0: SymmetricMemory rendezvous: the buffer is null or empty");
  EXPECT_CONTAINS(invalidUsageOf([&] { SymmetricMemory::rendezvous(comm, &byte, 0); }), "null or empty");
  EXPECT_CONTAINS(invalidUsageOf([&] { SymmetricMemory::rendezvous(comm, &byte, 1, 6); }),
                  "a signal pad of 6 bytes must be a multiple of 4");
  EXPECT_CONTAINS(invalidUsageOf([&] { SymmetricMemory::rendezvous(comm, &byte, 1, 0); }), "at least 4");
}

}  // namespace
}  // namespace ferry
