#pragma once
// The benchmark proper, run by every rank: for each collective (or sendrecv), type, op and size,
// check ferry's result against the host reference (poisoned output, random input), then time it out
// of place and in place, and time NCCL on the same buffers when it is loaded. Rank 0 prints
// nccl-tests style rows and keeps them for the JSON report.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/launcher.hpp"
#include "ferry/comm.hpp"

namespace ferry::tools {

// What one sweep times: one of ferry's collectives, or sendrecv, which is none of them. The values
// below kCollectiveCount are the Collective of the same value (benchmarkOf, collectiveOf).
// sendrecv is nccl-tests' sendrecv_perf: every rank sends `count` elements to rank (r + 1) % n and
// receives `count` from rank (r - 1 + n) % n in one group (ferry's send/recv, NCCL's
// ncclSend/ncclRecv between ncclGroupStart and ncclGroupEnd); out of place only; busbw = algbw.
enum class Benchmark : int { SendRecv = kCollectiveCount };
inline constexpr int kBenchmarkCount = kCollectiveCount + 1;

constexpr Benchmark benchmarkOf(Collective c) { return static_cast<Benchmark>(c); }
// The collective b times; none for sendrecv.
constexpr std::optional<Collective> collectiveOf(Benchmark b) {
  const int v = static_cast<int>(b);
  if (v >= 0 && v < kCollectiveCount) return static_cast<Collective>(v);
  return std::nullopt;
}
// "sendrecv", or the collective's name (toString(Collective)).
std::string_view benchmarkName(Benchmark b);
// "sendrecv" ("send_recv"; case-insensitively) or a name parseCollective takes.
std::optional<Benchmark> parseBenchmark(std::string_view name);

// How NCCL's buffers are set up, as nccl-tests' -R 0, 1 and 2: as they come (cudaMalloc, the same
// buffers ferry uses), from ncclMemAlloc and registered (ncclCommRegister: NCCL may skip its staging
// copies), or from ncclMemAlloc and registered as symmetric windows (ncclCommWindowRegister: NCCL's
// symmetric kernels). A table's ratio is against the fastest of those measured, size by size.
enum class NcclVariant : int { Plain, Registered, Window };
inline constexpr int kNcclVariantCount = 3;
std::string_view ncclVariantName(NcclVariant v);  // "plain", "registered", "window"
std::optional<NcclVariant> parseNcclVariant(std::string_view name);

struct BenchOptions {
  std::vector<Benchmark> benchmarks{benchmarkOf(Collective::AllReduce)};
  std::uint64_t minBytes = 1 << 10;
  std::uint64_t maxBytes = 1 << 30;
  double stepFactor = 2;
  std::uint64_t stepBytes = 0;  // > 0: arithmetic steps instead of the factor
  std::vector<DataType> types{DataType::BFloat16};
  std::vector<ReduceOp> ops{ReduceOp::Sum};
  int root = 0;
  int iters = 20;  // calls per timed sample (per CUDA graph)
  int warmup = 5;
  int samples = 5;  // timed samples; the median is reported
  bool check = true;
  int graphLaunches = 1;  // -G: each sample launches a graph of `iters` calls this often; 0: no graph
  bool inPlace = true;
  bool registered = false;  // register ferry's buffers (Comm::registerBuffer): the zero-copy path
  std::string algorithm;    // forced for every collective that has it
  // How ferry's sums and averages of 16- and 8-bit floats add up (--accumulate; NCCL's: always
  // stepwise). Float32 is what the torch backend's fused-op compositions ask for.
  Accumulation accumulation = Accumulation::Stepwise;
  bool nccl = true;
  std::string ncclPath = "libnccl.so.2";
  std::vector<NcclVariant> ncclVariants{NcclVariant::Plain, NcclVariant::Registered, NcclVariant::Window};
  std::string jsonPath;
  std::string tunePath;
  int gpus = 1;  // visible; rank r runs on GPU localRank % gpus, so more ranks than GPUs share them
};

struct Measure {
  double us = -1;           // < 0: not measured
  std::uint64_t wrong = 0;  // elements that differ from the reference, summed over ranks
  // Host time one eager (not captured) call takes to return, in microseconds, slowest rank's
  // median; < 0: not measured (only out of place).
  double hostUs = -1;
};

struct BenchRow {
  Benchmark benchmark;
  std::uint64_t bytes, count;
  DataType type;
  ReduceOp op;
  int root;
  std::string algorithm;  // the collective's algorithm; "p2p" for sendrecv (ferry's send/recv kernel)
  Measure outOfPlace, inPlace;
  std::array<Measure, kNcclVariantCount> ncclVariants;  // indexed by NcclVariant; us < 0: not measured
  Measure nccl;                                         // the fastest of ncclVariants
  int ncclBest = -1;                                    // its NcclVariant; -1: none measured
};

// Runs everything the options ask for; returns the process exit code (non-zero when a result
// was wrong). Throws on errors (CUDA, bootstrap, bad options).
int runBench(const BenchOptions& options, const RankInfo& rank);

// nccl-tests' bus bandwidth factor (busbw = algbw * factor).
double busFactor(Benchmark b, int worldSize);

}  // namespace ferry::tools
