// The channel layer for programs that write their own kernels: memory, registration, connections,
// semaphores, MemoryChannel, PortChannel and the proxy service that serves port channels. Device
// handles come out as bytes (device_handle()): copy them to device memory and pass a pointer to a
// kernel, which reads the struct of include/ferry/device/<name>.hpp (python/examples/ has one).
//
// Futures mirror the C++ API: recv_memory and connect return at once and get() waits (releasing the
// GIL), so a rank can post all its connects before waiting for any, as the C++ code does.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "ferry/communicator.hpp"
#include "ferry/connection.hpp"
#include "ferry/errors.hpp"
#include "ferry/memory.hpp"
#include "ferry/memory_channel.hpp"
#include "ferry/port_channel.hpp"
#include "ferry/semaphore.hpp"

namespace nb = nanobind;

namespace ferry::python {
namespace {

// An allocation from gpuAlloc or hostAlloc, freed when the last reference goes.
struct Allocation {
  std::shared_ptr<void> memory;
  std::size_t bytes = 0;
  bool device = false;
  std::uintptr_t address() const { return reinterpret_cast<std::uintptr_t>(memory.get()); }
};

template <class T>
struct Pending {
  std::shared_future<T> future;
  T get() {
    nb::gil_scoped_release unlocked;
    return future.get();
  }
  bool ready() const { return future.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
};

template <class Handle>
nb::bytes bytesOf(const Handle& h) {
  static_assert(std::is_trivially_copyable_v<Handle>);
  return nb::bytes(reinterpret_cast<const char*>(&h), sizeof h);
}

TransportFlags flagsOf(const nb::handle& transports) {
  if (nb::isinstance<Transport>(transports)) return TransportFlags(nb::cast<Transport>(transports));
  TransportFlags flags;
  for (nb::handle t : transports) flags = flags | TransportFlags(nb::cast<Transport>(t));
  return flags;
}

std::chrono::duration<double> secondsOf(double s) {
  if (!(s > 0)) throw Error(ErrorCode::InvalidUsage, "timeout must be a positive number of seconds, not " + std::to_string(s));
  return std::chrono::duration<double>(s);
}

}  // namespace

void bindChannels(nb::module_& m) {
  nb::enum_<Transport>(m, "Transport", nb::is_arithmetic())
      .value("cuda_ipc", Transport::CudaIpc)
      .value("host_memory", Transport::HostMemory)
      .value("ethernet", Transport::Ethernet)
      .value("infiniband", Transport::InfiniBand);

  nb::class_<Allocation>(m, "Allocation", "Memory from gpu_alloc or host_alloc; freed with the last reference.")
      .def_prop_ro("address", &Allocation::address)
      .def_ro("nbytes", &Allocation::bytes)
      .def_ro("device", &Allocation::device, "True for GPU memory");
  m.def(
      "gpu_alloc", [](std::size_t bytes) { return Allocation{gpuAlloc(bytes), bytes, true}; }, nb::arg("nbytes"),
      "Device memory on the current CUDA device that peers can map (cuMem); its contents are unspecified.");
  m.def(
      "host_alloc", [](std::size_t bytes) { return Allocation{hostAlloc(bytes), bytes, false}; }, nb::arg("nbytes"),
      "Host memory that peers on this host can map (memfd).");

  nb::class_<RegisteredMemory>(m, "RegisteredMemory")
      .def_prop_ro("address", [](const RegisteredMemory& r) { return reinterpret_cast<std::uintptr_t>(r.data()); },
                   "Where the bytes are mapped in this process (0 where they cannot be).")
      .def_prop_ro("nbytes", &RegisteredMemory::size)
      .def_prop_ro("rank", &RegisteredMemory::rank)
      .def_prop_ro("is_local", &RegisteredMemory::isLocal)
      .def_prop_ro("device", &RegisteredMemory::device, "The owner's CUDA device; -1 for host memory.")
      .def("serialize", [](const RegisteredMemory& r) {
        const auto v = r.serialize();
        return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size());
      })
      .def_static(
          "deserialize",
          [](nb::bytes b) {
            const auto* p = reinterpret_cast<const std::byte*>(b.c_str());
            std::span<const std::byte> bytes(p, b.size());
            nb::gil_scoped_release unlocked;
            return RegisteredMemory::deserialize(bytes);
          },
          nb::arg("data"));

  nb::class_<Pending<RegisteredMemory>>(m, "PendingMemory")
      .def("get", &Pending<RegisteredMemory>::get)
      .def("ready", &Pending<RegisteredMemory>::ready);
  nb::class_<Pending<std::shared_ptr<Connection>>>(m, "PendingConnection")
      .def("get", &Pending<std::shared_ptr<Connection>>::get)
      .def("ready", &Pending<std::shared_ptr<Connection>>::ready);

  nb::class_<Connection>(m, "Connection")
      .def_prop_ro("rank", &Connection::rank)
      .def_prop_ro("remote_rank", &Connection::remoteRank)
      .def_prop_ro("transport", &Connection::transport)
      .def(
          "write",
          [](Connection& c, const RegisteredMemory& dst, std::uint64_t dstOffset, const RegisteredMemory& src,
             std::uint64_t srcOffset, std::uint64_t bytes) { c.write(dst, dstOffset, src, srcOffset, bytes); },
          nb::arg("dst"), nb::arg("dst_offset"), nb::arg("src"), nb::arg("src_offset"), nb::arg("nbytes"),
          "Copies src[src_offset:+nbytes] to the peer's dst[dst_offset:]; complete after flush().")
      .def(
          "flush",
          [](Connection& c, std::optional<double> timeout) {
            nb::gil_scoped_release unlocked;
            if (timeout)
              c.flush(secondsOf(*timeout));
            else
              c.flush();
          },
          nb::arg("timeout") = nb::none());

  nb::class_<Communicator>(m, "Communicator", "Registers memory and connects this rank to its peers.")
      .def(nb::init<std::shared_ptr<Bootstrap>>(), nb::arg("bootstrap"))
      .def(
          "register_memory",
          [](Communicator& c, std::uintptr_t address, std::size_t bytes, nb::handle transports) {
            return c.registerMemory(reinterpret_cast<void*>(address), bytes, flagsOf(transports));
          },
          nb::arg("address"), nb::arg("nbytes"), nb::arg("transports"))
      .def("send_memory", &Communicator::sendMemory, nb::arg("memory"), nb::arg("peer"), nb::arg("tag") = 0)
      .def(
          "recv_memory",
          [](Communicator& c, int peer, int tag) { return Pending<RegisteredMemory>{c.recvMemory(peer, tag)}; },
          nb::arg("peer"), nb::arg("tag") = 0)
      .def(
          "connect",
          [](Communicator& c, int peer, Transport t, int tag) {
            return Pending<std::shared_ptr<Connection>>{c.connect(peer, t, tag)};
          },
          nb::arg("peer"), nb::arg("transport"), nb::arg("tag") = 0);

  nb::class_<MemoryDevice2DeviceSemaphore>(m, "MemoryDevice2DeviceSemaphore",
                                          "Counters on this GPU that the peer's GPU signals (MemoryChannel).")
      .def(
          "__init__",
          [](MemoryDevice2DeviceSemaphore* self, Communicator& comm, std::shared_ptr<Connection> conn, int tag) {
            nb::gil_scoped_release unlocked;
            new (self) MemoryDevice2DeviceSemaphore(comm, std::move(conn), tag);
          },
          nb::arg("communicator"), nb::arg("connection"), nb::arg("tag") = 0)
      .def("device_handle", [](const MemoryDevice2DeviceSemaphore& s) { return bytesOf(s.deviceHandle()); });
  nb::class_<Host2DeviceSemaphore>(m, "Host2DeviceSemaphore",
                                  "Signalled by the peer's proxy, waited on by this GPU (PortChannel).")
      .def(
          "__init__",
          [](Host2DeviceSemaphore* self, Communicator& comm, std::shared_ptr<Connection> conn, int tag) {
            nb::gil_scoped_release unlocked;
            new (self) Host2DeviceSemaphore(comm, std::move(conn), tag);
          },
          nb::arg("communicator"), nb::arg("connection"), nb::arg("tag") = 0)
      .def("device_handle", [](const Host2DeviceSemaphore& s) { return bytesOf(s.deviceHandle()); });
  nb::class_<Host2HostSemaphore>(m, "Host2HostSemaphore", "Signalled and waited on by host threads.")
      .def(
          "__init__",
          [](Host2HostSemaphore* self, Communicator& comm, std::shared_ptr<Connection> conn, int tag) {
            nb::gil_scoped_release unlocked;
            new (self) Host2HostSemaphore(comm, std::move(conn), tag);
          },
          nb::arg("communicator"), nb::arg("connection"), nb::arg("tag") = 0)
      .def("signal", &Host2HostSemaphore::signal)
      .def(
          "wait",
          [](Host2HostSemaphore& s, std::optional<double> timeout) {
            nb::gil_scoped_release unlocked;
            if (timeout)
              s.wait(secondsOf(*timeout));
            else
              s.wait();
          },
          nb::arg("timeout") = nb::none())
      .def("poll", &Host2HostSemaphore::poll);

  nb::class_<MemoryChannel>(m, "MemoryChannel", "This GPU loads and stores the peer's memory (NVLink/PCIe).")
      .def(
          "__init__",
          [](MemoryChannel* self, std::shared_ptr<MemoryDevice2DeviceSemaphore> sem, const RegisteredMemory& dst,
             std::uintptr_t src, std::uintptr_t packets) {
            new (self) MemoryChannel(std::move(sem), dst, reinterpret_cast<void*>(src), reinterpret_cast<void*>(packets));
          },
          nb::arg("semaphore"), nb::arg("dst"), nb::arg("src"), nb::arg("packets") = 0)
      .def("device_handle", [](const MemoryChannel& c) { return bytesOf(c.deviceHandle()); });

  nb::class_<PortChannel>(m, "PortChannel", "This GPU asks the proxy to move bytes over the connection.")
      .def("device_handle", [](const PortChannel& c) { return bytesOf(c.deviceHandle()); });
  nb::class_<PortChannelService>(m, "PortChannelService", "The proxy thread that serves port channels.")
      .def(nb::init<int>(), nb::arg("fifo_size") = 512)
      .def(
          "add_channel",
          [](PortChannelService& s, std::shared_ptr<Host2DeviceSemaphore> sem, std::optional<RegisteredMemory> dst,
             std::optional<RegisteredMemory> src) {
            if (dst.has_value() != src.has_value())
              throw Error(ErrorCode::InvalidUsage, "PortChannelService.add_channel: give both dst and src, or neither");
            return dst ? s.addChannel(std::move(sem), *dst, *src) : s.addChannel(std::move(sem));
          },
          nb::arg("semaphore"), nb::arg("dst") = nb::none(), nb::arg("src") = nb::none())
      .def("add_memory", &PortChannelService::addMemory, nb::arg("memory"))
      .def("remove_memory", &PortChannelService::removeMemory, nb::arg("memory_id"))
      .def("start", &PortChannelService::start)
      .def("stop", &PortChannelService::stop, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("running", &PortChannelService::running);

  m.attr("memory_channel_handle_bytes") = sizeof(MemoryChannelDeviceHandle);
  m.attr("port_channel_handle_bytes") = sizeof(PortChannelDeviceHandle);
  m.attr("semaphore_handle_bytes") = sizeof(SemaphoreDeviceHandle);
}

}  // namespace ferry::python
