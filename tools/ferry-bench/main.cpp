// ferry-bench: nccl-tests style benchmark of ferry's collectives and send/recv, with NCCL timed beside them.
//
//   ferry-bench                                   # allreduce, bf16 sum, 1 KiB .. 1 GiB, all local GPUs
//   ferry-bench allgather -b 8 -e 128M -f 2 -d float
//   ferry-bench sendrecv -e 1G                    # ring send/recv, as nccl-tests' sendrecv_perf
//   ferry-bench all -e 64M --json results.json    # every collective, then sendrecv
//   ferry-bench allreduce --tune tuning.json      # time every algorithm, write a tuning table
//   mpirun -np 4 ferry-bench ...  /  torchrun --nproc-per-node 4 ferry-bench ...
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>

#include "bench.hpp"
#include "common/launcher.hpp"
#include "common/parse_bytes.hpp"
#include "ferry/errors.hpp"

namespace {

using namespace ferry;
using namespace ferry::tools;

std::uint64_t bytesOption(const std::string& text) {
  if (auto bytes = ferry::tools::parseBytes(text)) return *bytes;
  throw CLI::ValidationError("size", "'" + text + "' is not a size (e.g. 4096, 1K, 64M, 1G)");
}

int gpuCount(std::string& why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0) why = "the CUDA runtime lists no device";
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ferry-bench: times ferry's collectives and send/recv (and NCCL's beside them) across the local GPUs"};
  BenchOptions o;
  std::string what = "allreduce", minB = "1K", maxB = "1G", stepB, types = "bf16", ops = "sum";
  int ngpus = 0, check = 1, graph = 1;
  bool list = false, noNccl = false, noInPlace = false;
  app.add_option(
         "collective", what,
         "allreduce, allgather, reducescatter, alltoall, broadcast, reduce, sendrecv (each rank sends "
         "to rank + 1 and receives from rank - 1 in one group), or all (every one of them)")
      ->capture_default_str();
  app.add_option("-b,--minbytes", minB, "smallest size (bytes; K, M, G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", maxB, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", o.stepFactor, "size multiplier between rows")->capture_default_str();
  app.add_option("-i,--stepbytes", stepB, "size increment between rows (instead of -f)");
  app.add_option("-d,--datatype", types, "data type(s), comma-separated, or all")->capture_default_str();
  app.add_option("-o,--op", ops, "reduce op(s), comma-separated, or all")->capture_default_str();
  app.add_option("-r,--root", o.root, "broadcast and reduce root")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "calls per timed sample")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up calls")->capture_default_str();
  app.add_option("-N,--samples", o.samples, "timed samples (the median is reported)")->capture_default_str();
  app.add_option("-c,--check", check, "check results (1) or not (0)")->capture_default_str();
  app.add_option(
         "-G,--cudagraph", graph,
         "capture the timed calls in a CUDA graph and launch it this many times per sample (0: stream "
         "launches)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("-g,--ngpus", ngpus,
                 "ranks to start (default: every local GPU; more ranks than GPUs share them, which checks "
                 "results but times nothing real, without NCCL); ignored under mpirun/torchrun");
  int hosts = 1;
  app.add_option("--hosts", hosts,
                 "pose the ranks as this many hosts (consecutive ranks share one), so that ferry's Comm "
                 "across hosts and NCCL's network transport run on loopback (docs/multi-node.md); it must "
                 "divide the ranks")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--algo", o.algorithm, "force this algorithm where it applies (see --list)");
  app.add_flag("--no-nccl", noNccl, "do not time NCCL");
  app.add_option("--nccl", o.ncclPath, "the NCCL library to compare with")->capture_default_str();
  std::string ncclVariants = "plain,registered,window";
  app.add_option("--nccl-variants", ncclVariants,
                 "how NCCL's buffers are set up, comma-separated (nccl-tests' -R 0, 1, 2): plain (ferry's "
                 "cudaMalloc buffers), registered (ncclMemAlloc + ncclCommRegister), window (ncclMemAlloc + "
                 "ncclCommWindowRegister); the ratio is against the fastest")
      ->capture_default_str();
  app.add_flag("--no-in-place", noInPlace, "time out-of-place calls only");
  std::string accumulate = "stepwise";
  app.add_option("--accumulate", accumulate,
                 "how ferry sums and averages 16- and 8-bit floats: stepwise (rounded after each rank's "
                 "term, as NCCL does) or float32 (rounded once: Accumulation::Float32, on the algorithms "
                 "that run it, on one host; the algorithm column still names the stepwise choice)")
      ->check(CLI::IsMember({"stepwise", "float32"}))
      ->capture_default_str();
  int registered = 0;
  app.add_option("-R,--registered", registered,
                 "register ferry's buffers (1): calls above the LL sizes then run zero-copy (NCCL's: "
                 "--nccl-variants)")
      ->capture_default_str();
  app.add_option("--json", o.jsonPath, "also write the results as JSON to this file");
  app.add_option("--tune", o.tunePath, "time every algorithm at every size and write a tuning table (JSON)");
  app.add_flag("--list", list, "list the algorithms of every collective and exit");
  CLI11_PARSE(app, argc, argv);
  o.accumulation = accumulate == "float32" ? Accumulation::Float32 : Accumulation::Stepwise;
  if (o.accumulation == Accumulation::Float32 && (!o.tunePath.empty() || hosts > 1)) {
    std::cerr << "ferry-bench: --accumulate float32 runs on one host's ranks, and --tune writes the default "
                 "table, which stepwise calls read; drop --accumulate float32 (or --hosts and --tune)\n";
    return 2;
  }

  try {
    if (list) {
      for (int c = 0; c < kCollectiveCount; ++c) {
        std::printf("%s:", std::string(toString(static_cast<Collective>(c))).c_str());
        for (const auto& n : Comm::algorithmNames(static_cast<Collective>(c))) std::printf(" %s", n.c_str());
        std::printf("\n");
      }
      return 0;
    }
    o.minBytes = bytesOption(minB);
    o.maxBytes = bytesOption(maxB);
    if (!stepB.empty()) o.stepBytes = bytesOption(stepB);
    // (Written so that a NaN step factor fails too.)
    if (o.minBytes == 0 || o.maxBytes < o.minBytes ||
        (o.stepBytes == 0 && !(o.stepFactor > 1 && std::isfinite(o.stepFactor))))
      throw CLI::ValidationError("sizes", "need 0 < minbytes <= maxbytes and a finite step factor > 1");
    if (o.iters < 1 || o.samples < 1 || o.warmup < 0)
      throw CLI::ValidationError("iters", "need iters, samples >= 1");
    o.check = check != 0;
    o.registered = registered != 0;
    o.graphLaunches = graph;
    o.nccl = !noNccl;
    o.inPlace = !noInPlace;
    auto splitList = [](const std::string& s) {
      std::vector<std::string> out;
      std::size_t b = 0;
      while (b <= s.size()) {
        const std::size_t e = s.find(',', b);
        out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
        if (e == std::string::npos) break;
        b = e + 1;
      }
      return out;
    };
    o.ncclVariants.clear();
    for (const auto& v : splitList(ncclVariants)) {
      const auto variant = parseNcclVariant(v);
      if (!variant)
        throw CLI::ValidationError("nccl-variants", "unknown NCCL variant '" + v + "' (plain, registered, window)");
      if (std::find(o.ncclVariants.begin(), o.ncclVariants.end(), *variant) == o.ncclVariants.end())
        o.ncclVariants.push_back(*variant);
    }
    o.benchmarks.clear();
    if (what == "all") {
      for (int b = 0; b < kBenchmarkCount; ++b) o.benchmarks.push_back(static_cast<Benchmark>(b));
    } else if (auto b = parseBenchmark(what)) {
      o.benchmarks.push_back(*b);
    } else {
      throw CLI::ValidationError("collective", "unknown collective '" + what + "'");
    }
    o.types.clear();
    for (const auto& t : splitList(types)) {
      if (t == "all") {
        for (int i = 0; i < kDataTypeCount; ++i) o.types.push_back(static_cast<DataType>(i));
      } else if (auto d = parseDataType(t)) {
        o.types.push_back(*d);
      } else {
        throw CLI::ValidationError("datatype", "unknown data type '" + t + "'");
      }
    }
    o.ops.clear();
    for (const auto& t : splitList(ops)) {
      if (t == "all") {
        for (int i = 0; i < kReduceOpCount; ++i) o.ops.push_back(static_cast<ReduceOp>(i));
      } else if (auto op = parseReduceOp(t)) {
        o.ops.push_back(*op);
      } else {
        throw CLI::ValidationError("op", "unknown reduce op '" + t + "'");
      }
    }

    std::string why;
    o.gpus = gpuCount(why);
    if (o.gpus == 0) {
      std::printf("ferry-bench: no CUDA GPU visible (%s): nothing to benchmark on this machine.\n",
                  why.c_str());
      return 0;
    }
    if (auto rank = rankFromEnvironment()) {
      if (hosts > 1 && std::getenv("FERRY_BENCH_ROOT") == nullptr) {
        std::cerr << "ferry-bench: --hosts poses the ranks ferry-bench starts itself as hosts; under mpirun or "
                     "torchrun the hosts are the real ones (FERRY_MULTI_HOST=1 runs ferry's Comm across them)\n";
        return 2;
      }
      return runBench(o, *rank);
    }

    // Started by hand: one rank per GPU, each a copy of this program (more ranks than GPUs share
    // them: that checks every result but times nothing real).
    const int ranks = ngpus > 0 ? ngpus : o.gpus;
    if (ranks < 2) {
      std::printf(
          "ferry-bench: %d GPU: collectives need at least 2 ranks; nothing to compare (-g 2 runs two "
          "ranks on it, which checks results but measures nothing real).\n",
          ranks);
      return 0;
    }
    if (ranks % hosts != 0)
      throw CLI::ValidationError("--hosts", std::to_string(ranks) + " ranks cannot be split evenly over " +
                                                std::to_string(hosts) + " hosts");
    return spawnRanks(ranks, argv, hosts);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "ferry-bench: " << e.what() << "\n";
    return 1;
  }
}
