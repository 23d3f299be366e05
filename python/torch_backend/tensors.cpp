#include "tensors.hpp"

#include <torch/csrc/distributed/c10d/Types.hpp>

namespace ferry::torch_backend {

DataType dataTypeOf(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kChar: return DataType::Int8;
    case at::kByte: return DataType::Uint8;
    case at::kBool: return DataType::Uint8;  // as NCCL: one byte, 0 or 1 (MIN/MAX are AND/OR)
    case at::kInt: return DataType::Int32;
    case at::kLong: return DataType::Int64;
    case at::kHalf: return DataType::Float16;
    case at::kFloat: return DataType::Float32;
    case at::kDouble: return DataType::Float64;
    case at::kBFloat16: return DataType::BFloat16;
    case at::kFloat8_e4m3fn: return DataType::Fp8E4M3;
    case at::kFloat8_e5m2: return DataType::Fp8E5M2;
    default:
      TORCH_CHECK(false, "ferry backend: ", op, ": no ferry data type for ", t.scalar_type(),
                  " (int8, uint8, bool, int32, int64, float16, bfloat16, float32, float64, float8_e4m3fn, "
                  "float8_e5m2 are)");
  }
}

void checkTensor(const at::Tensor& t, int device, const char* op) {
  TORCH_CHECK(t.is_cuda(), "ferry backend: ", op, ": tensors must be on a CUDA device, not ", t.device(),
              " (a group 'cpu:gloo,cuda:ferry' sends CPU tensors to gloo)");
  TORCH_CHECK(t.get_device() == device, "ferry backend: ", op, ": a tensor on cuda:", t.get_device(),
              " for a process group on cuda:", device, " (call torch.cuda.set_device before init_process_group)");
  TORCH_CHECK(t.is_contiguous(t.suggest_memory_format()) && t.is_non_overlapping_and_dense(), "ferry backend: ",
              op, ": tensors must be dense (pass tensor.contiguous())");
}

void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* op) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "ferry backend: ", op, ": input is ", a.scalar_type(),
              ", output ", b.scalar_type());
}

ReduceSpec reduceSpecOf(const c10d::ReduceOp& op, const at::Tensor& like, const char* name) {
  ReduceSpec spec;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: spec.plain = ReduceOp::Sum; return spec;
    case c10d::ReduceOp::PRODUCT: spec.plain = ReduceOp::Prod; return spec;
    case c10d::ReduceOp::MIN: spec.plain = ReduceOp::Min; return spec;
    case c10d::ReduceOp::MAX: spec.plain = ReduceOp::Max; return spec;
    case c10d::ReduceOp::AVG: spec.plain = ReduceOp::Avg; return spec;
    case c10d::ReduceOp::PREMUL_SUM: {
      // NCCLPreMulSumSupplement: the name in every torch (2.15 adds PreMulSumSupplement and keeps it).
      const auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s != nullptr, "ferry backend: ", name, ": PREMUL_SUM without its factor");
      if (s->tensor_factor.defined()) {
        spec.factor = s->tensor_factor.to(like.device(), like.scalar_type()).contiguous();
        spec.premul = PreMulSum{spec.factor.data_ptr(), /*onDevice=*/true};
      } else {
        spec.factor = at::scalar_tensor(s->double_factor, at::TensorOptions().dtype(like.scalar_type()));
        spec.premul = PreMulSum{spec.factor.data_ptr(), /*onDevice=*/false};
      }
      return spec;
    }
    default:
      TORCH_CHECK(false, "ferry backend: ", name, ": reduce op ", static_cast<int>(op.op_),
                  " is not supported (SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM are)");
  }
}

}  // namespace ferry::torch_backend
