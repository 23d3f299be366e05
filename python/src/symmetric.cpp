// Symmetric memory for ferry.torch.symm: the segments it allocates (gpuAlloc, so peers can map
// them), found again by address at rendezvous; the allocator functions torch's
// CUDAPluggableAllocator loads from this module (a MemPool of symmetric memory); and
// SymmetricMemory itself (include/ferry/symmetric_memory.hpp).
#include <cuda_runtime_api.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/vector.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"
#include "ferry/symmetric_memory.hpp"

namespace nb = nanobind;

namespace ferry::python {
namespace {

// Every live segment by base address. A segment is freed when it leaves this table and no
// registration (a SymmetricMemory) holds it any more.
class Segments {
 public:
  static Segments& instance() {
    static Segments* s = new Segments;  // never destroyed: torch may free segments at exit
    return *s;
  }

  // @pre bytes > 0, device a valid CUDA device.
  std::uintptr_t allocate(std::size_t bytes, int device) {
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = device;
    if (cudaSetDevice(device) != cudaSuccess)
      throw Error(ErrorCode::InvalidUsage, "symmetric memory: no CUDA device " + std::to_string(device));
    std::shared_ptr<void> memory;
    try {
      memory = gpuAlloc(bytes);
    } catch (...) {
      cudaSetDevice(previous);
      throw;
    }
    cudaSetDevice(previous);
    const auto base = reinterpret_cast<std::uintptr_t>(memory.get());
    std::lock_guard lock(mu_);
    live_[base] = {std::move(memory), bytes};
    return base;
  }

  bool release(std::uintptr_t base) {
    std::lock_guard lock(mu_);
    return live_.erase(base) == 1;
  }

  // (base, bytes) of the segment that holds address, if any.
  std::optional<std::pair<std::uintptr_t, std::size_t>> find(std::uintptr_t address) {
    std::lock_guard lock(mu_);
    auto it = live_.upper_bound(address);
    if (it == live_.begin()) return std::nullopt;
    --it;
    if (address >= it->first + it->second.bytes) return std::nullopt;
    return std::make_pair(it->first, it->second.bytes);
  }

 private:
  struct Segment {
    std::shared_ptr<void> memory;
    std::size_t bytes = 0;
  };
  std::mutex mu_;
  std::map<std::uintptr_t, Segment> live_;
};

}  // namespace
}  // namespace ferry::python

// The allocator interface of torch.cuda.memory.CUDAPluggableAllocator, exported from this module
// by name. An error cannot cross into torch: it is printed, and a null pointer is torch's
// out-of-memory error.
extern "C" __attribute__((visibility("default"))) void* ferry_symmetric_alloc(ssize_t size, int device,
                                                                              cudaStream_t) {
  if (size <= 0) return nullptr;
  try {
    return reinterpret_cast<void*>(
        ferry::python::Segments::instance().allocate(static_cast<std::size_t>(size), device));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: symmetric memory pool: %s\n", e.what());
    return nullptr;
  }
}

extern "C" __attribute__((visibility("default"))) void ferry_symmetric_free(void* ptr, ssize_t, int,
                                                                            cudaStream_t) {
  ferry::python::Segments::instance().release(reinterpret_cast<std::uintptr_t>(ptr));
}

namespace ferry::python {

void bindSymmetric(nb::module_& m) {
  m.def(
      "symmetric_alloc",
      [](std::size_t bytes, int device) {
        if (bytes == 0) throw Error(ErrorCode::InvalidUsage, "symmetric_alloc: nbytes must be positive");
        return Segments::instance().allocate(bytes, device);
      },
      nb::arg("nbytes"), nb::arg("device"),
      "A segment of device memory peers can map (gpuAlloc), zeroed; its base address. Free it with "
      "symmetric_free.");
  m.def(
      "symmetric_free", [](std::uintptr_t base) { return Segments::instance().release(base); },
      nb::arg("base"),
      "Forgets the segment at base (freed once no SymmetricMemory holds it); False if there is none.");
  m.def(
      "symmetric_segment",
      [](std::uintptr_t address) -> nb::object {
        auto found = Segments::instance().find(address);
        if (!found) return nb::none();
        return nb::make_tuple(found->first, found->second);
      },
      nb::arg("address"), "(base, nbytes) of the symmetric segment that holds address, or None.");

  m.def(
      "device_bytes",
      [](std::uintptr_t address, std::size_t bytes, int device, nb::handle owner) {
        // A torch tensor through DLPack, which carries the device: a peer's memory mapped here is
        // used from this rank's device, whatever GPU holds it.
        return nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<1>>(reinterpret_cast<void*>(address), {bytes},
                                                                   owner, {}, nb::dtype<std::uint8_t>(),
                                                                   nb::device::cuda::value, device)
            .cast();
      },
      nb::arg("address"), nb::arg("nbytes"), nb::arg("device"), nb::arg("owner"),
      "A torch.uint8 tensor of nbytes at a device address of CUDA device `device`, keeping owner alive.");

  const auto seconds = [](double ms) { return std::chrono::duration<double>(ms / 1000.0); };
  const auto streamOf = [](std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); };
  nb::class_<SymmetricMemory>(
      m, "SymmetricMemory",
      "A buffer per rank, mapped by every rank, with signal pads (symmetric_memory.hpp).")
      .def_static(
          "rendezvous",
          [](Communicator& comm, std::uintptr_t address, std::size_t bytes, std::size_t padBytes, int tag) {
            nb::gil_scoped_release unlocked;
            return SymmetricMemory::rendezvous(comm, reinterpret_cast<void*>(address), bytes, padBytes, tag);
          },
          nb::arg("communicator"), nb::arg("address"), nb::arg("nbytes"),
          nb::arg("signal_pad_bytes") = SymmetricMemory::kDefaultSignalPadBytes, nb::arg("tag") = 0)
      .def_ro_static("default_signal_pad_size", &SymmetricMemory::kDefaultSignalPadBytes)
      .def_prop_ro("rank", &SymmetricMemory::rank)
      .def_prop_ro("world_size", &SymmetricMemory::worldSize)
      .def_prop_ro("buffer_size", &SymmetricMemory::bufferBytes)
      .def_prop_ro("signal_pad_size", &SymmetricMemory::signalPadBytes)
      .def_prop_ro("channels", &SymmetricMemory::channels)
      .def_prop_ro("buffer_ptrs",
                   [](const SymmetricMemory& s) {
                     std::vector<std::uintptr_t> v;
                     for (void* p : s.bufferPtrs()) v.push_back(reinterpret_cast<std::uintptr_t>(p));
                     return v;
                   })
      .def_prop_ro("signal_pad_ptrs",
                   [](const SymmetricMemory& s) {
                     std::vector<std::uintptr_t> v;
                     for (std::uint32_t* p : s.signalPadPtrs())
                       v.push_back(reinterpret_cast<std::uintptr_t>(p));
                     return v;
                   })
      .def_prop_ro(
          "buffer_ptrs_dev",
          [](const SymmetricMemory& s) { return reinterpret_cast<std::uintptr_t>(s.bufferPtrsDevice()); })
      .def_prop_ro(
          "signal_pad_ptrs_dev",
          [](const SymmetricMemory& s) { return reinterpret_cast<std::uintptr_t>(s.signalPadPtrsDevice()); })
      .def(
          "put_signal",
          [=](const SymmetricMemory& s, int dst, int channel, double timeoutMs, std::uintptr_t stream) {
            s.putSignal(dst, channel, seconds(timeoutMs), streamOf(stream));
          },
          nb::arg("dst_rank"), nb::arg("channel") = 0, nb::arg("timeout_ms") = 0.0, nb::arg("stream") = 0)
      .def(
          "wait_signal",
          [=](const SymmetricMemory& s, int src, int channel, double timeoutMs, std::uintptr_t stream) {
            s.waitSignal(src, channel, seconds(timeoutMs), streamOf(stream));
          },
          nb::arg("src_rank"), nb::arg("channel") = 0, nb::arg("timeout_ms") = 0.0, nb::arg("stream") = 0)
      .def(
          "barrier",
          [=](const SymmetricMemory& s, int channel, double timeoutMs, std::uintptr_t stream) {
            s.barrier(channel, seconds(timeoutMs), streamOf(stream));
          },
          nb::arg("channel") = 0, nb::arg("timeout_ms") = 0.0, nb::arg("stream") = 0)
      .def(
          "put",
          [=](const SymmetricMemory& s, int dst, std::size_t dstOffset, std::uintptr_t src, std::size_t nbytes,
              int blocks, std::uintptr_t stream) {
            s.put(dst, dstOffset, reinterpret_cast<const void*>(src), nbytes, blocks, streamOf(stream));
          },
          nb::arg("dst_rank"), nb::arg("dst_offset"), nb::arg("src_ptr"), nb::arg("nbytes"), nb::arg("blocks") = 0,
          nb::arg("stream") = 0)
      .def("abort", &SymmetricMemory::abort, nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace ferry::python
