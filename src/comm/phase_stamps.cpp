#include "comm/phase_stamps.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string_view>
#include <vector>

#include "ferry/collective.hpp"
#include "platform/cuda_check.hpp"
#include "platform/device_upload.hpp"

namespace ferry {
namespace {

double median(std::vector<double>& v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// The per-call durations of one (collective, count), in us.
struct Phases {
  std::vector<double> gap, announce, startWait, data, end, kernel;
};

}  // namespace

PhaseStamps::PhaseStamps(int rank) : rank_(rank) {
  FERRY_CUDA_CHECK(cudaGetDevice(&device_));
  FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ring_), sizeof(PhaseRecord) * kPhaseRecords));
  zeroNow(ring_, sizeof(PhaseRecord) * kPhaseRecords);
}

PhaseStamps::~PhaseStamps() {
  try {
    std::fputs(summary().c_str(), stderr);
  } catch (...) {
    // A diagnostic: a failing device at teardown has already been reported by the Comm.
  }
  cudaFree(ring_);
}

std::string PhaseStamps::summary() const {
  int previous = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&previous));
  FERRY_CUDA_CHECK(cudaSetDevice(device_));
  std::vector<PhaseRecord> records(kPhaseRecords);
  int clockKhz = 0;
  cudaError_t err = cudaDeviceSynchronize();
  if (err == cudaSuccess)
    err = cudaMemcpy(records.data(), ring_, sizeof(PhaseRecord) * kPhaseRecords, cudaMemcpyDeviceToHost);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&clockKhz, cudaDevAttrClockRate, device_);
  cudaSetDevice(previous);
  if (err != cudaSuccess)
    return "ferry: phase stamps: could not read them back: " + std::string(cudaGetErrorString(err)) + "\n";

  const double usPerClock = clockKhz > 0 ? 1e3 / clockKhz : 0;
  auto clocks = [&](std::uint64_t a, std::uint64_t b) { return static_cast<double>(b - a) * usPerClock; };
  std::map<std::uint64_t, Phases> byKey;
  for (const PhaseRecord& r : records) {
    if (r.call == 0 || r.exitedNs == 0 || r.exitedNs < r.enteredNs) continue;  // never written, or cut short
    Phases& p = byKey[r.key];
    const PhaseRecord& before = records[(r.call - 1) % kPhaseRecords];
    if (before.call == r.call - 1 && before.exitedNs != 0 && r.enteredNs >= before.exitedNs)
      p.gap.push_back(static_cast<double>(r.enteredNs - before.exitedNs) / 1e3);
    p.announce.push_back(clocks(r.clocks[kEntered], r.clocks[kAnnounced]));
    const std::uint64_t started = r.clocks[kStarted] != 0 ? r.clocks[kStarted] : r.clocks[kAnnounced];
    p.startWait.push_back(clocks(r.clocks[kAnnounced], started));
    p.data.push_back(clocks(started, r.clocks[kDataDone]));
    p.end.push_back(clocks(r.clocks[kDataDone], r.clocks[kExited]));
    p.kernel.push_back(static_cast<double>(r.exitedNs - r.enteredNs) / 1e3);
  }
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "ferry: phase stamps of rank %d (GPU %d, SM clock taken as %.0f MHz), medians in us:\n"
                "  %-14s %12s %7s %8s %8s %10s %8s %8s %8s\n",
                rank_, device_, clockKhz / 1e3, "collective", "count", "calls", "gap", "announce",
                "start wait", "data", "end", "kernel");
  out += line;
  for (auto& [key, p] : byKey) {
    const int op = static_cast<int>(key >> 56);
    const std::uint64_t count = key & ((std::uint64_t{1} << 56) - 1);
    const std::string_view name =
        op == kPhaseSendRecv ? std::string_view("sendrecv bytes") : toString(static_cast<Collective>(op));
    std::snprintf(line, sizeof line, "  %-14.*s %12llu %7zu %8.2f %8.2f %10.2f %8.2f %8.2f %8.2f\n",
                  static_cast<int>(name.size()), name.data(),
                  static_cast<unsigned long long>(count), p.kernel.size(), median(p.gap), median(p.announce),
                  median(p.startWait), median(p.data), median(p.end), median(p.kernel));
    out += line;
  }
  return out;
}

}  // namespace ferry
