// The words every call uses: DataType, ReduceOp, Collective, with the C++ names' values (integer
// enums, so int(ferry.DataType.bfloat16) is the C++ value).
#include <string>

#include "bindings.hpp"
#include "ferry/collective.hpp"
#include "ferry/datatype.hpp"

namespace nb = nanobind;

namespace ferry::python {

void bindVocabulary(nb::module_& m) {
  nb::enum_<DataType>(m, "DataType", nb::is_arithmetic(), "Element types of collective buffers.")
      .value("int8", DataType::Int8)
      .value("uint8", DataType::Uint8)
      .value("int32", DataType::Int32)
      .value("uint32", DataType::Uint32)
      .value("int64", DataType::Int64)
      .value("uint64", DataType::Uint64)
      .value("float16", DataType::Float16)
      .value("float32", DataType::Float32)
      .value("float64", DataType::Float64)
      .value("bfloat16", DataType::BFloat16)
      .value("float8_e4m3", DataType::Fp8E4M3)
      .value("float8_e5m2", DataType::Fp8E5M2);
  m.def("size_of", [](DataType t) { return sizeOf(t); }, nb::arg("dtype"), "Bytes of one element.");

  nb::enum_<ReduceOp>(m, "ReduceOp", nb::is_arithmetic(), "How reducing collectives combine the ranks' elements.")
      .value("sum", ReduceOp::Sum)
      .value("prod", ReduceOp::Prod)
      .value("max", ReduceOp::Max)
      .value("min", ReduceOp::Min)
      .value("avg", ReduceOp::Avg, "The sum divided by the number of ranks (integers: truncated toward zero).");

  nb::enum_<Accumulation>(m, "Accumulation", nb::is_arithmetic(),
                          "How a sum or average of 16- and 8-bit floats adds up the ranks' terms.")
      .value("stepwise", Accumulation::Stepwise, "In the call's type, rounded after each rank (as NCCL).")
      .value("float32", Accumulation::Float32, "In float32, in rank order, rounded once (as a torch.sum of them).");

  nb::enum_<Collective>(m, "Collective", nb::is_arithmetic())
      .value("all_reduce", Collective::AllReduce)
      .value("all_gather", Collective::AllGather)
      .value("reduce_scatter", Collective::ReduceScatter)
      .value("all_to_all", Collective::AllToAll)
      .value("broadcast", Collective::Broadcast)
      .value("reduce", Collective::Reduce);
}

}  // namespace ferry::python
