// ferry-perf: microbenchmarks of ferry's data plane (tools/ferry-perf/primitives.hpp lists them):
// signal round trips over MemoryChannel and PortChannel, the FIFO's round trip and pickup latency,
// and put bandwidth per pair and all pairs at once. One process per GPU, started by ferry-perf
// itself, or under mpirun / torchrun.
//
//   ferry-perf                          # every local GPU (at least 2)
//   ferry-perf -g 2 -s 64M,256M --json perf.json
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "common/launcher.hpp"
#include "common/parse_bytes.hpp"
#include "ferry-perf/primitives.hpp"

int main(int argc, char** argv) {
  using namespace ferry::tools;
  CLI::App app{"ferry-perf: latency and bandwidth of ferry's channels and FIFO across the local GPUs"};
  PerfOptions o;
  std::string sizes = "1M,8M,64M,256M";
  int ngpus = 0;
  app.add_option("-s,--sizes", sizes, "put sizes, comma-separated (K, M, G suffixes)")->capture_default_str();
  app.add_option("-n,--round-trips", o.roundTrips, "signal round trips per sample")->capture_default_str();
  app.add_option("-N,--samples", o.samples, "timed samples (the median is reported)")->capture_default_str();
  app.add_option("-g,--ngpus", ngpus,
                 "ranks to start (default: every local GPU; more ranks than GPUs share them, which checks "
                 "the code but times nothing real); ignored under mpirun/torchrun");
  app.add_option("--json", o.jsonPath, "also write the rows as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    o.sizes.clear();
    std::stringstream list(sizes);
    for (std::string item; std::getline(list, item, ',');) {
      const auto bytes = parseBytes(item);
      if (!bytes || *bytes == 0) throw CLI::ValidationError("sizes", "'" + item + "' is not a size (e.g. 1M)");
      o.sizes.push_back(*bytes);
    }
    if (o.sizes.empty()) throw CLI::ValidationError("sizes", "no size given");
    if (o.roundTrips < 1 || o.samples < 1) throw CLI::ValidationError("samples", "need round trips and samples >= 1");
    int gpus = 0;
    const cudaError_t err = cudaGetDeviceCount(&gpus);
    if (err != cudaSuccess || gpus == 0) {
      std::printf("ferry-perf: no CUDA GPU visible (%s): nothing to measure on this machine.\n",
                  err != cudaSuccess ? cudaGetErrorString(err) : "the CUDA runtime lists no device");
      return 0;
    }
    if (auto rank = rankFromEnvironment()) {
      if (rank->worldSize < 2) throw CLI::ValidationError("ranks", "ferry-perf needs at least 2 ranks");
      if (cudaSetDevice(rank->localRank % gpus) != cudaSuccess) throw CLI::ValidationError("device", "cudaSetDevice failed");
      return runPrimitives(o, *rank, gpus);
    }
    const int ranks = ngpus > 0 ? ngpus : gpus;
    if (ranks < 2) {
      std::printf("ferry-perf: %d GPU: the channels need 2 ranks (-g 2 runs two ranks on it, which checks "
                  "the code but measures nothing real).\n", gpus);
      return 0;
    }
    return spawnRanks(ranks, argv);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "ferry-perf: " << e.what() << "\n";
    return 1;
  }
}
