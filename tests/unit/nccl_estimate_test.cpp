// ncclGroupSimulateEnd's model (shims/nccl/estimate.hpp): it reproduces the measurements it was
// fitted to within 10%, grows with size and ranks' bus bytes, and is 0 for nothing to move.
#include <gtest/gtest.h>

#include "estimate.hpp"

namespace ferry::nccl {
namespace {

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

TEST(NcclEstimate, MatchesTheMeasurementsItWasFittedTo) {
  // docs/measurements/h200x2-2026-11-24.md, allreduce bf16 on 2 H200, graph-replayed.
  const struct {
    std::size_t bytes;
    const char* algorithm;
    double measuredUs;
  } points[] = {{1 * KiB, "allreduce_ll", 4.08},       {64 * KiB, "allreduce_ll", 4.38},
                {1 * MiB, "allreduce_two_shot", 12.36}, {64 * MiB, "allreduce_two_shot", 206.91},
                {1 * GiB, "allreduce_two_shot", 3146.69}};
  for (const auto& p : points) {
    const double us = estimateMicroseconds({Collective::AllReduce, p.bytes, DataType::BFloat16}, p.algorithm, 2);
    EXPECT_NEAR(us, p.measuredUs, 0.1 * p.measuredUs) << p.bytes << " bytes";
  }
}

TEST(NcclEstimate, GrowsWithBusBytes) {
  const CallCost small{Collective::AllReduce, 1 * MiB, DataType::Float32};
  const CallCost large{Collective::AllReduce, 64 * MiB, DataType::Float32};
  EXPECT_LT(estimateMicroseconds(small, "allreduce_two_shot", 2), estimateMicroseconds(large, "allreduce_two_shot", 2));
  // An all-reduce moves 2(n-1)/n of its bytes, an all-gather (n-1)/n of its output.
  const CallCost gather{Collective::AllGather, 64 * MiB, DataType::Float32};
  EXPECT_LT(estimateMicroseconds(gather, "allgather_push", 8), estimateMicroseconds(large, "allreduce_two_shot", 8));
  EXPECT_LT(estimateMicroseconds(large, "allreduce_two_shot", 2), estimateMicroseconds(large, "allreduce_two_shot", 8));
}

TEST(NcclEstimate, NothingToMoveTakesNoTime) {
  EXPECT_EQ(estimateMicroseconds({Collective::AllReduce, 0, DataType::Float32}, "allreduce_ll", 4), 0.0);
  EXPECT_EQ(estimateMicroseconds({Collective::AllReduce, 1 * MiB, DataType::Float32}, "allreduce_ll", 1), 0.0);
  EXPECT_GT(estimateMicroseconds({std::nullopt, 4 * KiB, DataType::Uint8}, "p2p", 2), 0.0);
}

}  // namespace
}  // namespace ferry::nccl
