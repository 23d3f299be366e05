#pragma once
// ferry-perf's measurements of the data plane, one process per GPU (primitives.cu):
//   memory_channel_round_trip   signal then wait, ranks 0 and 1, one thread each (us)
//   memory_channel_relaxed_round_trip   the same with relaxedSignal (no fence: the flag latency)
//   port_channel_round_trip     the same through the FIFO, the proxy and a host-memory counter (us)
//   fifo_round_trip             push, the proxy's handler runs, sync returns; rank 0 alone (us)
//   fifo_pickup                 a host-timed estimate of push -> handler start (us, see primitives.cu)
//   {memory,port}_channel_put_{pair,all_pairs}   put bandwidth, rank 0 -> 1 alone, and every rank to
//                               every peer at once (GB/s per GPU); the bytes are checked first
#include <cstdint>
#include <string>
#include <vector>

#include "common/launcher.hpp"

namespace ferry::tools {

struct PerfOptions {
  std::vector<std::uint64_t> sizes = {1ull << 20, 8ull << 20, 64ull << 20, 256ull << 20};
  int roundTrips = 10000;  // per sample
  int samples = 7;         // the median is reported (the first two of warm-up are dropped)
  std::string jsonPath;    // rows as JSON, written by rank 0
};

struct PerfRow {
  std::string what;
  std::uint64_t bytes = 0;  // 0 for latencies
  double value = 0;
  std::string unit;
  std::uint64_t wrong = 0;  // bytes that arrived wrong in the check before timing
};

// Runs every measurement on this rank; rank 0 prints the table (and writes JSON). Returns the exit
// status: non-zero when a check found wrong bytes.
int runPrimitives(const PerfOptions& options, const RankInfo& rank, int devices);

}  // namespace ferry::tools
