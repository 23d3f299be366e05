// What an object that speaks DLPack (__dlpack__: JAX, NumPy, and the rest) describes, for
// ferry/buffers.py: its address, shape, strides, element type and device. Only read: nothing is
// copied, and the object is not kept.
#include <nanobind/ndarray.h>

#include <cstdint>

#include "bindings.hpp"

namespace nb = nanobind;

namespace ferry::python {

void bindDlpack(nb::module_& m) {
  m.def(
      "_dlpack_info",
      [](nb::ndarray<> a) {
        nb::list shape, strides;
        for (std::size_t i = 0; i < a.ndim(); ++i) {
          shape.append(a.shape(i));
          strides.append(a.stride_ptr() ? a.stride(i) : 0);  // in elements; none given: C order
        }
        const auto t = a.dtype();
        return nb::make_tuple(reinterpret_cast<std::uintptr_t>(a.data()), shape,
                              a.stride_ptr() ? nb::object(strides) : nb::none(), t.code, t.bits, t.lanes,
                              a.device_type(), a.device_id());
      },
      nb::arg("array"),
      "(address, shape, strides in elements or None, DLPack type code, bits, lanes, device type, device id)");
}

}  // namespace ferry::python
