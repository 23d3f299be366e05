#include "kernels/pointer_check.hpp"

#include <array>

#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "platform/cuda_driver.hpp"

namespace ferry {
namespace {

enum class Mode { Cached, Always, Never };

Mode mode() {
  static const Mode m = [] {
    const std::string& v = env().checkPointers;  // one of the three: env() checked it
    return v == "always" ? Mode::Always : v == "never" ? Mode::Never : Mode::Cached;
  }();
  return m;
}

// Allocations seen to be device memory, per thread (no lock on the per-call path), replaced
// round robin.
struct Known {
  std::uintptr_t begin = 0, end = 0;
  int device = -1;
};
struct KnownRanges {
  std::array<Known, 16> range{};
  unsigned next = 0;

  bool covers(std::uintptr_t p, std::uint64_t bytes, int device) const {
    for (const Known& k : range)
      if (k.device == device && p >= k.begin && p + bytes <= k.end && p + bytes >= p) return true;
    return false;
  }
  void add(std::uintptr_t begin, std::uintptr_t end, int device) {
    range[next++ % range.size()] = {begin, end, device};
  }
};
thread_local KnownRanges known;

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) (void)cudaGetLastError();
  return capture != cudaStreamCaptureStatusNone;
}

}  // namespace

std::string whyNotDeviceMemory(const void* p, std::uint64_t bytes, int device, cudaStream_t stream) {
  const Mode m = mode();
  if (m == Mode::Never || device < 0) return {};
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  if (m == Mode::Cached && known.covers(at, bytes, device)) return {};
  if (capturing(stream)) return {};
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return "not device memory of this rank's GPU " + std::to_string(device) + " (CUDA does not know it)";
  }
  const bool onDevice = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (!onDevice || attr.device != device)
    return "not device memory of this rank's GPU " + std::to_string(device) +
           (onDevice ? " but of GPU " + std::to_string(attr.device) : std::string(" (host memory?)"));
  if (m == Mode::Cached) {
    // The whole allocation, so that every later pointer into it is known; without the driver's
    // answer, only this call's range.
    std::uintptr_t begin = at, end = at + bytes;
    try {
      const CudaDriver& cu = cudaDriver();
      CUdeviceptr base = 0;
      std::size_t size = 0;
      if (cu.cuMemGetAddressRange(&base, &size, static_cast<CUdeviceptr>(at)) == CUDA_SUCCESS) {
        begin = static_cast<std::uintptr_t>(base);
        end = begin + size;
      }
    } catch (const Error&) {
    }
    known.add(begin, end, device);
  }
  return {};
}

}  // namespace ferry
