#pragma once
// What the ferry backend asks of a torch tensor before handing its memory to ferry::Comm: its
// ferry data type, that it is dense on the group's device, and the ferry reduce op of a c10d one
// (docs/pytorch.md). Every refusal names the call and what to do.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>

#include "ferry/comm.hpp"

namespace ferry::torch_backend {

DataType dataTypeOf(const at::Tensor& t, const char* op);

// A CUDA tensor on cuda:device, dense (contiguous in its suggested memory format).
void checkTensor(const at::Tensor& t, int device, const char* op);
void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* op);

// A c10d reduce op in ferry's terms: `plain` for SUM, PRODUCT, MIN, MAX, AVG; for PREMUL_SUM,
// `premul` points into `factor` (a one-element tensor of the call's type: on the device when the
// user gave a tensor factor, read when the op runs; on the host for a scalar, read at the call).
struct ReduceSpec {
  std::optional<ReduceOp> plain;
  PreMulSum premul;
  at::Tensor factor;
};
ReduceSpec reduceSpecOf(const c10d::ReduceOp& op, const at::Tensor& like, const char* name);

}  // namespace ferry::torch_backend
