// The module ferry._torch: the ferry backend's class for python/ferry/torch, which registers it,
// and the CPU and CUDA kernels of the fused ops (fused_ops.cpp).
#include <pybind11/chrono.h>
#include <torch/python.h>

#include <chrono>

#include "backend.hpp"
#include "fused_ops.hpp"

PYBIND11_MODULE(_torch, m) {
  m.doc() = "ferry's torch.distributed backend (import ferry.torch, not this)";
  namespace py = pybind11;
  using ferry::torch_backend::FerryBackend;
  py::module_::import("torch.distributed");  // registers c10d::Backend with pybind11 first
  py::class_<FerryBackend, c10d::Backend, c10::intrusive_ptr<FerryBackend>>(m, "FerryBackend")
      .def(py::init([](const std::string& idHex, int rank, int size, int device, double timeoutSeconds) {
             const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::duration<double>(timeoutSeconds));
             return c10::make_intrusive<FerryBackend>(idHex, rank, size, device, timeout);
           }),
           py::arg("unique_id_hex"), py::arg("rank"), py::arg("size"), py::arg("device"), py::arg("timeout_seconds"),
           py::call_guard<py::gil_scoped_release>())
      // The group's timeout (a datetime.timedelta), for the options python/ferry/torch builds.
      .def_property_readonly("_timeout", [](FerryBackend& b) { return b.timeout(); })
      // Why the group cannot run on ferry (empty when it does): python/ferry/torch forwards it.
      .def_property_readonly("_why_not_native", [](FerryBackend& b) { return b.whyNotNative(); })
      // ferry.torch.register_tensor's (collective: it meets the other ranks, so the GIL is released).
      .def("_register_tensor", &FerryBackend::registerTensor, py::arg("tensor"),
           py::call_guard<py::gil_scoped_release>())
      .def("_deregister_tensor", &FerryBackend::deregisterTensor, py::arg("id"),
           py::call_guard<py::gil_scoped_release>());
  // fused_pipeline.AG_AUTO_MIN_FLOPS, RS_AUTO_MIN_FLOPS and SCALED_RS_AUTO_MIN_FLOPS, for the fused
  // ops' kernels (fused_ops.cpp).
  m.def("_set_fused_pipeline_min_flops", &ferry::torch_backend::setFusedPipelineMinFlops, py::arg("all_gather"),
        py::arg("reduce_scatter"), py::arg("scaled_reduce_scatter"));
}
