// The NCCL API's argument checks (shims/nccl/checks.hpp), without a GPU: each names the argument
// and the rule it broke, with NCCL's result code.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

#include "checks.hpp"
#include "expect_contains.hpp"
#include "ferry/errors.hpp"

namespace ferry::nccl {
namespace {

template <class F>
ApiError errorOf(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return {ncclSuccess, ""};
}

TEST(NcclChecks, AcceptValidArguments) {
  EXPECT_NO_THROW(checkNotNull(this, "comm"));
  EXPECT_NO_THROW(checkDataType(ncclBfloat16));
  EXPECT_NO_THROW(checkDataType(ncclFloat8e5m2));
  EXPECT_NO_THROW(checkRankCount(1));
  EXPECT_NO_THROW(checkRankIn(3, 4, "root"));
  EXPECT_NO_THROW(checkCount(1 << 20, ncclFloat64, 8));
  EXPECT_NO_THROW(checkBuffer(nullptr, 0, "sendbuff"));
  EXPECT_NO_THROW(checkConfig(nullptr));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  EXPECT_NO_THROW(checkConfig(&config));
  config.blocking = 0;
  EXPECT_NO_THROW(checkConfig(&config));
}

TEST(NcclChecks, NameTheArgumentAndTheRule) {
  ApiError e = errorOf([] { checkNotNull(nullptr, "comm"); });
  EXPECT_EQ(e.result, ncclInvalidArgument);
  EXPECT_EQ(e.message, "comm is NULL");
  e = errorOf([] { checkDataType(static_cast<ncclDataType_t>(12)); });
  EXPECT_EQ(e.result, ncclInvalidArgument);
  EXPECT_EQ(e.message, "datatype 12 is not an ncclDataType_t (0..11)");
  EXPECT_EQ(errorOf([] { checkDataType(static_cast<ncclDataType_t>(-1)); }).result, ncclInvalidArgument);
  EXPECT_EQ(errorOf([] { checkRankCount(0); }).message, "nranks 0 must be at least 1");
  EXPECT_EQ(errorOf([] { checkRankIn(4, 4, "peer"); }).message, "peer 4 is out of range [0, 4)");
  EXPECT_EQ(errorOf([] { checkRankIn(-1, 4, "root"); }).message, "root -1 is out of range [0, 4)");
  EXPECT_CONTAINS(
      errorOf([] { checkCount(std::numeric_limits<std::size_t>::max() / 4, ncclFloat32, 2); }).message,
      "of ncclFloat32 overflows the byte size");
  EXPECT_EQ(errorOf([] { checkBuffer(nullptr, 5, "recvbuff"); }).message, "recvbuff is NULL with count 5");
}

// Buffers must be device memory of the communicator's GPU, as NCCL checks them (NCCL_CHECK_POINTERS=1):
// anything else is ncclInvalidArgument naming the argument, the address and what it is instead.
TEST(NcclChecks, BufferPointersMustBeDeviceMemoryOfTheCommGpu) {
  using Kind = PointerPlace::Kind;
  int x = 0;
  const void* p = &x;
  EXPECT_NO_THROW(checkPointerPlace(p, {Kind::Device, 2, ""}, "sendbuff", 2));
  EXPECT_NO_THROW(checkPointerPlace(p, {Kind::Managed, 0, ""}, "recvbuff", 0));
  struct Case {
    PointerPlace place;
    const char* what;
  };
  const Case bad[] = {
      {{Kind::Unknown, -1, ""}, "CUDA does not know it (host memory from malloc or the stack, or freed?)"},
      {{Kind::Host, 0, ""}, "it is pinned host memory"},
      {{Kind::Device, 1, ""}, "it is device memory of GPU 1"},
      {{Kind::Managed, 3, ""}, "it is managed memory of GPU 3"},
      {{Kind::Error, -1, "cudaErrorNoDevice: no CUDA-capable device is detected"},
       "cudaPointerGetAttributes failed (cudaErrorNoDevice: no CUDA-capable device is detected)"},
  };
  char address[32];
  std::snprintf(address, sizeof(address), "%p", p);
  for (const Case& c : bad) {
    const ApiError e = errorOf([&] { checkPointerPlace(p, c.place, "sendbuff", 0); });
    EXPECT_EQ(e.result, ncclInvalidArgument) << c.what;
    EXPECT_EQ(e.message, std::string("sendbuff ") + address + " is not a valid pointer: " + c.what +
                             "; it must be device memory of the communicator's GPU 0");
  }
}

// The whole check of a call's buffer, with CUDA asked for real: a stack address is never device
// memory (with a GPU, CUDA does not know it; without one, CUDA cannot say).
TEST(NcclChecks, AHostBufferIsAnInvalidArgumentWithOrWithoutAGpu) {
  int x = 0;
  const PointerPlace place = pointerPlace(&x);
  EXPECT_NE(place.kind, PointerPlace::Kind::Device);
  EXPECT_NE(place.kind, PointerPlace::Kind::Managed);
  const ApiError e = errorOf([&] { checkDeviceBuffer(&x, 4, "recvbuff", 0, nullptr); });
  EXPECT_EQ(e.result, ncclInvalidArgument);
  EXPECT_CONTAINS(e.message, "recvbuff 0x");
  EXPECT_CONTAINS(e.message, "is not a valid pointer");
  // NULL is its own rule; with count 0 nothing is asked (NCCL does nothing for an empty call).
  EXPECT_EQ(errorOf([] { checkDeviceBuffer(nullptr, 4, "sendbuff", 0, nullptr); }).message,
            "sendbuff is NULL with count 4");
  EXPECT_NO_THROW(checkDeviceBuffer(nullptr, 0, "sendbuff", 0, nullptr));
  EXPECT_NO_THROW(checkDeviceBuffer(&x, 0, "sendbuff", 0, nullptr));
}

TEST(NcclChecks, ConfigMustComeFromTheInitializer) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 1;
  EXPECT_CONTAINS(errorOf([&] { checkConfig(&config); }).message, "NCCL_CONFIG_INITIALIZER");
  config = NCCL_CONFIG_INITIALIZER;
  config.size = 4;
  EXPECT_CONTAINS(errorOf([&] { checkConfig(&config); }).message, "config->size 4 is too small");
  config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 2;
  EXPECT_EQ(errorOf([&] { checkConfig(&config); }).message, "config->blocking 2 must be 0 or 1");
}

TEST(NcclChecks, CtaBoundsArePositiveAndOrderedAndBecomeCommOptions) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.maxCTAs = 0;
  EXPECT_EQ(errorOf([&] { checkConfig(&config); }).message, "config->maxCTAs 0 must be >= 1");
  config = NCCL_CONFIG_INITIALIZER;
  config.minCTAs = 8;
  config.maxCTAs = 4;
  EXPECT_EQ(errorOf([&] { checkConfig(&config); }).message, "config->minCTAs 8 exceeds config->maxCTAs 4");
  config.minCTAs = 2;
  EXPECT_NO_THROW(checkConfig(&config));
  const CommOptions o = commOptions(&config);
  EXPECT_EQ(o.minBlocks, 2);
  EXPECT_EQ(o.maxBlocks, 4);
  config = NCCL_CONFIG_INITIALIZER;  // unset: ferry's choice
  EXPECT_EQ(commOptions(&config).minBlocks, 0);
  EXPECT_EQ(commOptions(&config).maxBlocks, 0);
  EXPECT_EQ(commOptions(nullptr, o).maxBlocks, 4);  // a split without a config keeps its parent's
}

TEST(NcclChecks, ElementSizesAndNamesFollowNcclNumbering) {
  EXPECT_EQ(elementBytes(ncclInt8), 1u);
  EXPECT_EQ(elementBytes(ncclHalf), 2u);
  EXPECT_EQ(elementBytes(ncclBfloat16), 2u);
  EXPECT_EQ(elementBytes(ncclFloat), 4u);
  EXPECT_EQ(elementBytes(ncclUint64), 8u);
  EXPECT_EQ(elementBytes(ncclFloat8e4m3), 1u);
  EXPECT_EQ(elementBytes(ncclNumTypes), 0u);
  EXPECT_STREQ(dataTypeName(ncclFloat16), "ncclFloat16");
  EXPECT_STREQ(dataTypeName(static_cast<ncclDataType_t>(40)), "(not a datatype)");
}

TEST(NcclResults, EveryResultHasAString) {
  for (int r = 0; r < ncclNumResults; ++r)
    EXPECT_STRNE(resultString(static_cast<ncclResult_t>(r)), "unknown result code");
  EXPECT_STREQ(resultString(static_cast<ncclResult_t>(99)), "unknown result code");
}

TEST(NcclResults, GuardedMapsExceptionsToResultsAndKeepsTheMessage) {
  EXPECT_EQ(guarded("ncclX", [] { return ncclSuccess; }), ncclSuccess);
  EXPECT_EQ(guarded("ncclX",
                    []() -> ncclResult_t {
                      throw ApiError{ncclInvalidArgument, "count is bad"};
                    }),
            ncclInvalidArgument);
  EXPECT_STREQ(lastError(), "ncclX: count is bad");
  EXPECT_EQ(guarded("ncclY", []() -> ncclResult_t { throw Error(ErrorCode::Timeout, "rank 3 never came"); }),
            ncclRemoteError);
  EXPECT_CONTAINS(std::string(lastError()), "rank 3 never came");
  // ferry's own usage errors stay ncclInvalidUsage (bad pointers are caught before, as ncclInvalidArgument).
  EXPECT_EQ(
      guarded("ncclW", []() -> ncclResult_t { throw Error(ErrorCode::InvalidUsage, "overlapping buffers"); }),
      ncclInvalidUsage);
  EXPECT_EQ(guarded("ncclZ", []() -> ncclResult_t { throw std::runtime_error("boom"); }), ncclInternalError);
  EXPECT_EQ(guarded("ncclZ", []() -> ncclResult_t { throw 42; }), ncclInternalError);
}

}  // namespace
}  // namespace ferry::nccl
