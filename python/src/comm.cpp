// Comm at the level of addresses: every buffer is a device address (a Python int) with a count and
// a DataType, every stream a cudaStream_t as an int. The package's ferry.Comm (python/ferry/comm.py)
// turns tensors and arrays into these; this layer checks nothing the C++ Comm does not check
// already, so a bad argument is the same ferry.InvalidUsage either way.
//
// The GIL: released for what waits for other ranks or for the GPU (making the Comm, registering,
// deregistering, adding or removing algorithms, groupEnd's queueing does not wait); a collective
// call only queues work, and keeps it (releasing costs more than the call's own host path saves).
#include <cuda_runtime_api.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "ferry/algorithm.hpp"
#include "ferry/comm.hpp"
#include "ferry/communicator.hpp"
#include "ferry/errors.hpp"

namespace nb = nanobind;

namespace ferry::python {
namespace {

using Address = std::uintptr_t;

const void* in(Address a) { return reinterpret_cast<const void*>(a); }
void* out(Address a) { return reinterpret_cast<void*>(a); }
cudaStream_t streamOf(Address s) { return reinterpret_cast<cudaStream_t>(s); }

// Makes device `device` current while a Comm is made on it (the C++ Comm takes the current one),
// then restores the caller's.
class DeviceScope {
 public:
  explicit DeviceScope(std::optional<int> device) {
    if (!device) return;
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    const cudaError_t e = cudaSetDevice(*device);
    if (e != cudaSuccess)
      throw CudaError("Comm: cannot use CUDA device " + std::to_string(*device) + ": " + cudaGetErrorString(e),
                      static_cast<int>(e));
    set_ = true;
  }
  ~DeviceScope() {
    if (set_ && previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
  bool set_ = false;
};

PreMulSum preMulOf(Address factor, bool onDevice) { return PreMulSum{in(factor), onDevice}; }

constexpr const char* kDefaultAccumulation =
    "accumulation: an Accumulation, or None for the Comm's default (FERRY_ACCUMULATION, stepwise unless set)";

}  // namespace

void bindComm(nb::module_& m) {
  nb::class_<AlgorithmInfo>(m, "AlgorithmInfo", "One algorithm of a Comm, as Comm.algorithms() lists it.")
      .def_ro("name", &AlgorithmInfo::name)
      .def_ro("collective", &AlgorithmInfo::collective)
      .def_prop_ro("kind", [](const AlgorithmInfo& a) { return std::string(toString(a.kind)); })
      .def_ro("constraints", &AlgorithmInfo::constraints)
      .def_ro("forced", &AlgorithmInfo::forced)
      .def_ro("reduces_in_rank_order", &AlgorithmInfo::reducesInRankOrder,
              "A reduction it runs equals the one in rank order bit for bit (false: rings, plans)")
      .def_ro("sums_in_float32", &AlgorithmInfo::sumsInFloat32,
              "It runs calls with Accumulation.float32 (the others are kept off them)")
      .def("__repr__", [](const AlgorithmInfo& a) {
        return "AlgorithmInfo(" + a.name + ", " + std::string(toString(a.kind)) +
               (a.constraints.empty() ? "" : ", " + a.constraints) + (a.forced ? ", forced" : "") + ")";
      });

  nb::class_<Comm>(m, "Comm",
                   "The collectives of a group of ranks, on device addresses (ferry.Comm takes tensors).")
      .def(
          "__init__",
          [](Comm* self, std::shared_ptr<Bootstrap> bootstrap, std::optional<int> device, int minBlocks,
             int maxBlocks, std::optional<CommOptions::ConnectFn> connect) {
            if (!bootstrap) throw Error(ErrorCode::InvalidUsage, "Comm: the bootstrap is None");
            CommOptions options;
            options.minBlocks = minBlocks;
            options.maxBlocks = maxBlocks;
            // A Python callable; nanobind's wrapper takes the GIL for each call (the Comm calls
            // it while it is made, below, without the GIL).
            if (connect) options.connect = std::move(*connect);
            nb::gil_scoped_release unlocked;
            DeviceScope scope(device);
            new (self) Comm(std::move(bootstrap), options);
          },
          nb::arg("bootstrap"), nb::arg("device") = nb::none(), nb::arg("min_blocks") = 0,
          nb::arg("max_blocks") = 0, nb::arg("connect") = nb::none(),
          "Collective over the bootstrap's ranks, on `device` (default: the current CUDA device). "
          "`connect(communicator, peer) -> Connection`, if given, makes the connection under the Comm's "
          "port channel to each peer (CommOptions::connect).")
      .def_static("why_not", &Comm::whyNot, nb::arg("bootstrap"),
                  "Why no Comm can be made over these ranks; empty when one can.")
      .def_prop_ro("rank", &Comm::rank)
      .def_prop_ro("world_size", &Comm::worldSize)
      .def_prop_ro("device", &Comm::device)
      .def_prop_ro("topology", &Comm::topology)
      .def(
          "all_reduce",
          [](Comm& c, Address send, Address recv, std::size_t count, DataType type, ReduceOp op, Address stream,
             std::optional<Accumulation> accumulation) {
            if (accumulation)
              c.allReduce(in(send), out(recv), count, type, op, *accumulation, streamOf(stream));
            else
              c.allReduce(in(send), out(recv), count, type, op, streamOf(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("count"), nb::arg("dtype"), nb::arg("op"), nb::arg("stream"),
          nb::arg("accumulation") = nb::none(), kDefaultAccumulation)
      .def(
          "all_reduce_premul",
          [](Comm& c, Address send, Address recv, std::size_t count, DataType type, Address factor, bool onDevice,
             Address stream) {
            c.allReduce(in(send), out(recv), count, type, preMulOf(factor, onDevice), streamOf(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("count"), nb::arg("dtype"), nb::arg("factor"),
          nb::arg("factor_on_device"), nb::arg("stream"))
      .def(
          "all_gather",
          [](Comm& c, Address send, Address recv, std::size_t sendCount, DataType type, Address stream) {
            c.allGather(in(send), out(recv), sendCount, type, streamOf(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("send_count"), nb::arg("dtype"), nb::arg("stream"))
      .def(
          "reduce_scatter",
          [](Comm& c, Address send, Address recv, std::size_t recvCount, DataType type, ReduceOp op,
             Address stream, std::optional<Accumulation> accumulation) {
            if (accumulation)
              c.reduceScatter(in(send), out(recv), recvCount, type, op, *accumulation, streamOf(stream));
            else
              c.reduceScatter(in(send), out(recv), recvCount, type, op, streamOf(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("recv_count"), nb::arg("dtype"), nb::arg("op"), nb::arg("stream"),
          nb::arg("accumulation") = nb::none(), kDefaultAccumulation)
      .def(
          "reduce_scatter_premul",
          [](Comm& c, Address send, Address recv, std::size_t recvCount, DataType type, Address factor,
             bool onDevice, Address stream) {
            c.reduceScatter(in(send), out(recv), recvCount, type, preMulOf(factor, onDevice), streamOf(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("recv_count"), nb::arg("dtype"), nb::arg("factor"),
          nb::arg("factor_on_device"), nb::arg("stream"))
      .def(
          "all_to_all",
          [](Comm& c, Address send, Address recv, std::size_t count, DataType type, Address stream) {
            c.allToAll(in(send), out(recv), count, type, streamOf(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("count"), nb::arg("dtype"), nb::arg("stream"))
      .def(
          "broadcast",
          [](Comm& c, Address send, Address recv, std::size_t count, DataType type, int root, Address stream) {
            c.broadcast(in(send), out(recv), count, type, root, streamOf(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("count"), nb::arg("dtype"), nb::arg("root"), nb::arg("stream"))
      .def(
          "reduce",
          [](Comm& c, Address send, Address recv, std::size_t count, DataType type, ReduceOp op, int root,
             Address stream, std::optional<Accumulation> accumulation) {
            if (accumulation)
              c.reduce(in(send), out(recv), count, type, op, *accumulation, root, streamOf(stream));
            else
              c.reduce(in(send), out(recv), count, type, op, root, streamOf(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("count"), nb::arg("dtype"), nb::arg("op"), nb::arg("root"),
          nb::arg("stream"), nb::arg("accumulation") = nb::none(), kDefaultAccumulation)
      .def(
          "reduce_premul",
          [](Comm& c, Address send, Address recv, std::size_t count, DataType type, Address factor, bool onDevice,
             int root, Address stream) {
            c.reduce(in(send), out(recv), count, type, preMulOf(factor, onDevice), root, streamOf(stream));
          },
          nb::arg("send"), nb::arg("recv"), nb::arg("count"), nb::arg("dtype"), nb::arg("factor"),
          nb::arg("factor_on_device"), nb::arg("root"), nb::arg("stream"))
      .def(
          "send",
          [](Comm& c, Address buffer, std::size_t count, DataType type, int peer, Address stream) {
            c.send(in(buffer), count, type, peer, streamOf(stream));
          },
          nb::arg("buffer"), nb::arg("count"), nb::arg("dtype"), nb::arg("peer"), nb::arg("stream"))
      .def(
          "recv",
          [](Comm& c, Address buffer, std::size_t count, DataType type, int peer, Address stream) {
            c.recv(out(buffer), count, type, peer, streamOf(stream));
          },
          nb::arg("buffer"), nb::arg("count"), nb::arg("dtype"), nb::arg("peer"), nb::arg("stream"))
      .def("group_start", &Comm::groupStart)
      .def("group_end", &Comm::groupEnd)
      .def(
          "register_buffer",
          [](Comm& c, Address ptr, std::size_t bytes) {
            nb::gil_scoped_release unlocked;
            return c.registerBuffer(out(ptr), bytes).id;
          },
          nb::arg("ptr"), nb::arg("bytes"), "Collective; returns the registration's id for deregister_buffer.")
      .def(
          "deregister_buffer",
          [](Comm& c, std::uint64_t id) {
            nb::gil_scoped_release unlocked;
            c.deregisterBuffer(BufferRegistration{id});
          },
          nb::arg("id"))
      .def("abort", &Comm::abort, nb::call_guard<nb::gil_scoped_release>())
      .def("aborted", &Comm::aborted, nb::call_guard<nb::gil_scoped_release>())
      .def("algorithms", &Comm::algorithms)
      .def(
          "set_algorithm", [](Comm& c, Collective coll, std::string_view name) { c.setAlgorithm(coll, name); },
          nb::arg("collective"), nb::arg("name"))
      .def("algorithm_for", &Comm::algorithmFor, nb::arg("collective"), nb::arg("bytes"), nb::arg("dtype"),
           nb::arg("registered") = false)
      .def(
          "add_plan_json",
          [](Comm& c, std::string_view json, std::string_view source) {
            const Plan plan = Plan::fromJson(json, source);
            nb::gil_scoped_release unlocked;
            c.addPlan(plan);
            return plan.algorithmName();
          },
          nb::arg("json"), nb::arg("source") = "a JSON string",
          "Collective: compiles the plan and adds it; returns the algorithm's name (\"plan:\" + its name).")
      .def(
          "add_plan_file",
          [](Comm& c, const std::string& path) {
            const Plan plan = Plan::fromFile(path);
            nb::gil_scoped_release unlocked;
            c.addPlan(plan);
            return plan.algorithmName();
          },
          nb::arg("path"))
      .def(
          "add_algorithm",
          [](Comm& c, std::shared_ptr<NativeAlgorithm> algorithm) {
            if (!algorithm) throw Error(ErrorCode::InvalidUsage, "Comm.add_algorithm: the algorithm is None");
            nb::gil_scoped_release unlocked;  // setup() takes it back for the Python side
            c.addAlgorithm(std::move(algorithm));
          },
          nb::arg("algorithm"), "Collective: runs algorithm.setup(comm) on every rank and adds it.")
      .def(
          "remove_algorithm",
          [](Comm& c, std::string_view name) {
            nb::gil_scoped_release unlocked;
            c.removeAlgorithm(name);
          },
          nb::arg("name"))
      .def_static("algorithm_names", &Comm::algorithmNames, nb::arg("collective"))
      .def_prop_ro("communicator", &Comm::communicator, nb::rv_policy::reference_internal,
                   "The Communicator under this Comm, for channels of the program's own (tags below 0x1000).");
}

}  // namespace ferry::python
