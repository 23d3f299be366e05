// Native algorithms written in Python: a subclass of ferry.NativeAlgorithm whose launch() queues a
// kernel of its own (CuPy, Triton, torch...) on call.stream, added to a Comm with
// comm.add_algorithm(). The Comm then treats it as it treats a C++ NativeAlgorithm
// (ferry/algorithm.hpp): every rank adds it, setup() runs on every rank, the selector asks why_not()
// once per call shape and prefers it for every shape it accepts.
//
// The GIL: the Comm calls these methods with or without it (add_algorithm releases it while the
// ranks agree; a collective call keeps it), so each override takes it. name(), collective(),
// constraints() and reduces_in_rank_order() are asked once and remembered: the Comm may ask for a name where Python cannot be
// entered any more (a Comm destroyed at interpreter exit).
#include <nanobind/stl/string.h>
#include <nanobind/trampoline.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings.hpp"
#include "ferry/algorithm.hpp"
#include "ferry/comm.hpp"

namespace nb = nanobind;

namespace ferry::python {
namespace {

class PyNativeAlgorithm : public NativeAlgorithm {
 public:
  NB_TRAMPOLINE(NativeAlgorithm);

  std::string name() const override {
    if (!name_) name_ = pureCall<std::string>("name");
    return *name_;
  }
  Collective collective() const override {
    if (!collective_) collective_ = pureCall<Collective>("collective");
    return *collective_;
  }
  std::string constraints() const override {
    if (!constraints_) {
      nb::gil_scoped_acquire locked;
      nb::object method = optionalMethod("constraints");
      constraints_ = method.is_valid() ? nb::cast<std::string>(method()) : std::string();
    }
    return *constraints_;
  }
  bool reducesInRankOrder() const override {
    if (!inRankOrder_) {
      nb::gil_scoped_acquire locked;
      nb::object method = optionalMethod("reduces_in_rank_order");
      inRankOrder_ = method.is_valid() && nb::cast<bool>(method());
    }
    return *inRankOrder_;
  }
  void setup(Comm& comm) override {
    nb::gil_scoped_acquire locked;
    nb::object method = optionalMethod("setup");
    if (method.is_valid()) method(nb::cast(&comm, nb::rv_policy::reference));
  }
  std::string whyNot(const CollectiveArgs& call) const override {
    nb::gil_scoped_acquire locked;
    nb::object method = optionalMethod("why_not");
    // A copy: Python may keep the object it is given.
    return method.is_valid() ? nb::cast<std::string>(method(CollectiveArgs(call))) : std::string();
  }
  void launch(const CollectiveArgs& call) override {
    nb::gil_scoped_acquire locked;
    selfObject().attr("launch")(CollectiveArgs(call));
  }

 private:
  nb::object selfObject() const { return nb::borrow(nb_trampoline.base()); }

  // The Python subclass's own method `name`, or an invalid object when it defines none (the base
  // class's default applies).
  nb::object optionalMethod(const char* name) const {
    nb::object self = selfObject();
    nb::object method = nb::getattr(self, name, nb::none());
    return method.is_none() ? nb::object() : method;
  }

  template <typename T>
  T pureCall(const char* name) const {
    nb::gil_scoped_acquire locked;
    return nb::cast<T>(selfObject().attr(name)());
  }

  mutable std::optional<std::string> name_;
  mutable std::optional<Collective> collective_;
  mutable std::optional<std::string> constraints_;
  mutable std::optional<bool> inRankOrder_;
};

}  // namespace

void bindAlgorithms(nb::module_& m) {
  nb::class_<CollectiveArgs>(m, "CollectiveArgs",
                             "One collective call as an algorithm sees it (NativeAlgorithm.why_not/launch).")
      .def_ro("collective", &CollectiveArgs::collective)
      .def_prop_ro("send", [](const CollectiveArgs& c) { return reinterpret_cast<std::uintptr_t>(c.send); },
                   "The input's device address (0 where this rank reads no input).")
      .def_prop_ro("recv", [](const CollectiveArgs& c) { return reinterpret_cast<std::uintptr_t>(c.recv); },
                   "The output's device address (0 where this rank writes no output).")
      .def_ro("count", &CollectiveArgs::count,
              "Elements as the Comm call takes them: per rank for all_gather and reduce_scatter, per peer "
              "for all_to_all, the whole buffer otherwise.")
      .def_ro("dtype", &CollectiveArgs::type)
      .def_ro("op", &CollectiveArgs::op)
      .def_ro("root", &CollectiveArgs::root)
      .def_prop_ro("stream", [](const CollectiveArgs& c) { return reinterpret_cast<std::uintptr_t>(c.stream); },
                   "The cudaStream_t to queue the work on.")
      .def_ro("rank", &CollectiveArgs::rank)
      .def_ro("world_size", &CollectiveArgs::worldSize)
      .def_ro("registered", &CollectiveArgs::registered)
      .def_ro("in_place", &CollectiveArgs::inPlace)
      .def_ro("bytes", &CollectiveArgs::bytes, "The larger of the input and output buffers, in bytes.");

  nb::class_<NativeAlgorithm, PyNativeAlgorithm>(
      m, "NativeAlgorithm",
      "Subclass it: name() and collective() say what it is; setup(comm) makes its channels (collective, "
      "on comm.communicator, tags below 0x1000); why_not(call) returns \"\" when it can run the call's "
      "shape, else why not; launch(call) queues the work on call.stream. Add it with "
      "Comm.add_algorithm on every rank.")
      .def(nb::init<>());
}

}  // namespace ferry::python
