// UniqueId and the TCP bootstrap: how ranks meet. Every call that waits for other ranks releases
// the GIL, so other Python threads run while it waits (and a wait that ends in TimeoutError
// leaves the interpreter usable).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/errors.hpp"

namespace nb = nanobind;

namespace ferry::python {
namespace {

using Seconds = std::optional<double>;

TcpBootstrap::Options optionsOf(Seconds timeout) {
  TcpBootstrap::Options o;
  if (timeout) {
    if (!(*timeout > 0))
      throw Error(ErrorCode::InvalidUsage, "bootstrap: timeout must be a positive number of seconds, not " +
                                               std::to_string(*timeout));
    o.timeout = std::chrono::duration<double>(*timeout);
  }
  return o;
}

nb::bytes bytesOf(const std::vector<std::byte>& v) { return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size()); }

}  // namespace

void bindBootstrap(nb::module_& m) {
  nb::class_<UniqueId>(m, "UniqueId",
                       "Where rank 0 listens and the job's secret: made by rank 0 (create), handed to the "
                       "others out of band (pickle it, or pass hex() through a file or a store).")
      .def_static("create", &UniqueId::create, nb::call_guard<nb::gil_scoped_release>(),
                  "A new id; its port is reserved for this process's rank 0 until the id is pickled or "
                  "release_root_port() is called.")
      .def("hex", &UniqueId::toHex)
      .def_static("from_hex", &UniqueId::fromHex, nb::arg("text"))
      .def_prop_ro("root_address", &UniqueId::rootAddress, "\"host:port\" of rank 0, for logs.")
      .def("__eq__", [](const UniqueId& a, const UniqueId& b) { return a.bytes == b.bytes; })
      .def("__hash__", [](const UniqueId& a) { return std::hash<std::string>()(a.toHex()); })
      .def("__repr__", [](const UniqueId& a) { return "UniqueId(root " + a.rootAddress() + ")"; })
      .def("release_root_port", &UniqueId::releaseRootPort,
           "For the process that made the id but will not be its rank 0: frees the port create() "
           "reserved, so that rank 0 can listen there. Pickling the id does this.")
      // Pickling is how an id reaches spawned ranks (multiprocessing, torch.multiprocessing), one of
      // which is rank 0 and must bind the port this process reserved: so the reservation is given
      // up here. When this process is rank 0 after all, init binds the port again.
      .def("__getstate__",
           [](const UniqueId& a) {
             a.releaseRootPort();
             return nb::bytes(reinterpret_cast<const char*>(a.bytes.data()), a.bytes.size());
           })
      .def("__setstate__", [](UniqueId& a, nb::bytes state) {
        new (&a) UniqueId();
        if (state.size() != UniqueId::kBytes)
          throw Error(ErrorCode::InvalidUsage, "UniqueId: a pickled id holds " + std::to_string(UniqueId::kBytes) +
                                                   " bytes, not " + std::to_string(state.size()));
        std::memcpy(a.bytes.data(), state.c_str(), UniqueId::kBytes);
      });

  nb::class_<Bootstrap>(m, "Bootstrap", "Ranks that found each other: a control plane, never on the data path.")
      .def_prop_ro("rank", &Bootstrap::rank)
      .def_prop_ro("size", &Bootstrap::size)
      .def_prop_ro("local_rank", &Bootstrap::localRank)
      .def_prop_ro("local_size", &Bootstrap::localSize)
      .def_prop_ro("host_ranks", &Bootstrap::hostRanks)
      .def("barrier", &Bootstrap::barrier, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "all_gather",
          [](Bootstrap& b, nb::bytes mine) {
            const std::size_t n = mine.size();
            std::vector<char> all(n * static_cast<std::size_t>(b.size()));
            if (n > 0) std::memcpy(all.data() + n * static_cast<std::size_t>(b.rank()), mine.c_str(), n);
            {
              nb::gil_scoped_release unlocked;
              b.allGather(all.data(), n);
            }
            std::vector<nb::bytes> out;
            for (int r = 0; r < b.size(); ++r) out.emplace_back(all.data() + n * static_cast<std::size_t>(r), n);
            return out;
          },
          nb::arg("data"), "Every rank's `data` (the same length on every rank), in rank order.")
      .def(
          "send",
          [](Bootstrap& b, nb::bytes data, int peer, int tag) {
            std::vector<char> copy(data.c_str(), data.c_str() + data.size());
            nb::gil_scoped_release unlocked;
            b.send(copy.data(), copy.size(), peer, tag);
          },
          nb::arg("data"), nb::arg("peer"), nb::arg("tag"))
      .def(
          "recv",
          [](Bootstrap& b, int peer, int tag) {
            std::vector<std::byte> v;
            {
              nb::gil_scoped_release unlocked;
              v = b.recv(peer, tag);
            }
            return bytesOf(v);
          },
          nb::arg("peer"), nb::arg("tag"));

  nb::class_<TcpBootstrap, Bootstrap>(m, "TcpBootstrap")
      .def_static(
          "create",
          [](const UniqueId& id, int rank, int size, Seconds timeout) {
            const auto o = optionsOf(timeout);
            nb::gil_scoped_release unlocked;
            return TcpBootstrap::create(id, rank, size, o);
          },
          nb::arg("id"), nb::arg("rank"), nb::arg("size"), nb::arg("timeout") = nb::none(),
          "Joins the job of `id` as `rank` of `size`; waits (at most `timeout` seconds, default "
          "FERRY_BOOTSTRAP_TIMEOUT) for every rank.")
      .def_static(
          "from_address",
          [](const std::string& root, int rank, int size, Seconds timeout) {
            const auto o = optionsOf(timeout);
            nb::gil_scoped_release unlocked;
            return TcpBootstrap::create(root, rank, size, o);
          },
          nb::arg("root"), nb::arg("rank"), nb::arg("size"), nb::arg("timeout") = nb::none(),
          "Joins through rank 0's \"host:port\" (set FERRY_BOOTSTRAP_SECRET on every rank).")
      .def_static(
          "from_environment",
          [](Seconds timeout) {
            const auto o = optionsOf(timeout);
            nb::gil_scoped_release unlocked;
            return TcpBootstrap::fromEnvironment(o);
          },
          nb::arg("timeout") = nb::none(), "From torchrun's MASTER_ADDR, RANK and WORLD_SIZE.")
      .def(
          "split",
          [](TcpBootstrap& b, int color, int key) {
            nb::gil_scoped_release unlocked;
            return b.split(color, key);
          },
          nb::arg("color"), nb::arg("key") = 0,
          "Collective: ranks of one color form a new group ordered by (key, rank); a negative color "
          "joins none and gets None.")
      .def_prop_ro("listen_address", &TcpBootstrap::listenAddress);
}

}  // namespace ferry::python
