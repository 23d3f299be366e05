#pragma once
// The benchmark proper, run by every rank: for each collective, type, op and size, check ferry's
// result against the host reference (poisoned output, random input), then time it out of place
// and in place, and time NCCL on the same buffers when it is loaded. Rank 0 prints nccl-tests
// style rows and keeps them for the JSON report.
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/comm.hpp"
#include "common/launcher.hpp"

namespace ferry::tools {

struct BenchOptions {
  std::vector<Collective> collectives{Collective::AllReduce};
  std::uint64_t minBytes = 1 << 10;
  std::uint64_t maxBytes = 1 << 30;
  double stepFactor = 2;
  std::uint64_t stepBytes = 0;  // > 0: arithmetic steps instead of the factor
  std::vector<DataType> types{DataType::BFloat16};
  std::vector<ReduceOp> ops{ReduceOp::Sum};
  int root = 0;
  int iters = 20;   // calls per timed sample (per CUDA graph)
  int warmup = 5;
  int samples = 5;  // timed samples; the median is reported
  bool check = true;
  int graphLaunches = 1;  // -G: each sample launches a graph of `iters` calls this often; 0: no graph
  bool inPlace = true;
  bool registered = false;  // register ferry's buffers (Comm::registerBuffer): the zero-copy path
  std::string algorithm;  // forced for every collective that has it
  bool nccl = true;
  std::string ncclPath = "libnccl.so.2";
  std::string jsonPath;
  std::string tunePath;
  int gpus = 1;  // visible; rank r runs on GPU localRank % gpus, so more ranks than GPUs share them
};

struct Measure {
  double us = -1;          // < 0: not measured
  std::uint64_t wrong = 0;  // elements that differ from the reference, summed over ranks
};

struct BenchRow {
  Collective collective;
  std::uint64_t bytes, count;
  DataType type;
  ReduceOp op;
  int root;
  std::string algorithm;
  Measure outOfPlace, inPlace, nccl;
};

// Runs everything the options ask for; returns the process exit code (non-zero when a result
// was wrong). Throws on errors (CUDA, bootstrap, bad options).
int runBench(const BenchOptions& options, const RankInfo& rank);

// nccl-tests' bus bandwidth factor.
double busFactor(Collective c, int worldSize);

}  // namespace ferry::tools
