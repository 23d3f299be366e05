// The CUDA kernels of ferry::fused_all_gather_matmul and ferry::fused_matmul_reduce_scatter
// (python/ferry/torch/fused_ops.py defines the ops and says what they compute): on a group whose
// CUDA backend is ferry's, the composition is queued from here, on the caller's stream, with no
// Python between the dispatcher and the GPU. A Python body costs tens of microseconds of host time
// per call (docs/fused.md measured it), more than the collective itself at the smaller shapes.
//
// Every other call goes to the Python body, through the ops ferry::_composed_* that fused_ops.py
// defines with the same schemas: groups on another backend, the pipelined form (FERRY_FUSED_PIPELINE
// and the size table of fused_pipeline.py) and registered workspaces (FERRY_FUSED_REGISTERED), read
// per call as the Python side reads them.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend.hpp"
#include "fused_ops.hpp"

namespace ferry::torch_backend {

namespace {

using AllGatherMatmulResult = std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>>;
using AllGatherMatmul = AllGatherMatmulResult(const at::Tensor&, at::TensorList, int64_t, c10::string_view, bool);
using MatmulReduceScatter = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, int64_t,
                                       c10::string_view);

// fused_pipeline.RS_AUTO_MIN_FLOPS, handed over by fused_ops.py as it loads, so that the size table
// has one source. Negative until then: no call is deferred for it.
std::atomic<double> pipelineMinFlops{-1.0};

bool envIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// Whether the Python body runs the call: the registered-workspace form, or the pipelined one
// (FERRY_FUSED_PIPELINE=1, or unset and a product of at least pipelineMinFlops; 0 for all-gathers,
// which the size table never pipelines).
bool pythonForm(double pipelinedFlops) {
  if (envIs("FERRY_FUSED_REGISTERED", "1") || envIs("FERRY_FUSED_PIPELINE", "1")) return true;
  if (envIs("FERRY_FUSED_PIPELINE", "0")) return false;
  const double min = pipelineMinFlops.load(std::memory_order_relaxed);
  return min >= 0 && pipelinedFlops > 0 && pipelinedFlops >= min;
}

// The group's backend for CUDA tensors if it is ferry's, else null (the Python body runs the call).
// The returned pointer keeps the backend alive for the call.
c10::intrusive_ptr<c10d::Backend> ferryBackend(const char* op, c10::string_view groupName) {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    group = c10d::resolve_process_group(std::string(groupName));
  } catch (const std::exception&) {
    TORCH_CHECK_VALUE(false, "ferry::", op, ": no process group named '", std::string(groupName),
                      "': pass group.group_name of a group made with dist.new_group (or dist.group.WORLD.group_name)");
  }
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = group->getBackend(c10::DeviceType::CUDA);
  } catch (const std::exception&) {
    return {};  // no backend for CUDA tensors: the Python body says what is wrong
  }
  auto* ferry = dynamic_cast<FerryBackend*>(backend.get());
  if (ferry == nullptr || !ferry->whyNotNative().empty()) return {};
  return backend;
}

int64_t wrapDim(const char* op, const char* what, int64_t dim, int64_t ndim) {
  TORCH_CHECK_VALUE(-ndim <= dim && dim < ndim, "ferry::", op, ": ", what, " ", dim, " is out of range for a ", ndim,
                    "-D tensor");
  return (dim % ndim + ndim) % ndim;
}

// 1-byte floats (fp8) travel as bytes, as the Python body sends them: gathering copies bits.
at::Tensor onWire(const at::Tensor& t) {
  at::Tensor wire = t.contiguous();
  return wire.element_size() == 1 && at::isFloatingType(wire.scalar_type()) ? wire.view(at::kByte) : wire;
}

AllGatherMatmulResult allGatherMatmul(const at::Tensor& shard, at::TensorList Bs, int64_t gatherDim,
                                      c10::string_view groupName, bool returnA) {
  static constexpr const char* kOp = "fused_all_gather_matmul";
  const auto backend = pythonForm(0) ? c10::intrusive_ptr<c10d::Backend>() : ferryBackend(kOp, groupName);
  if (!backend) {
    static auto composed = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("ferry::_composed_all_gather_matmul", "")
                               .typed<AllGatherMatmul>();
    return composed.call(shard, Bs, gatherDim, groupName, returnA);
  }
  const int64_t size = backend->getSize();
  const int64_t dim = wrapDim(kOp, "gather_dim", gatherDim, shard.dim());
  at::Tensor wire = onWire(shard);
  at::Tensor flat = at::empty({size * wire.numel()}, wire.options());
  c10d::AllgatherOptions opts;
  opts.asyncOp = false;  // on the caller's stream, as the matmuls after it
  backend->_allgather_base(flat, wire, opts);
  // flat stacks the ranks' shards along a new leading dim; move it next to `dim` and merge.
  std::vector<int64_t> stacked{size};
  stacked.insert(stacked.end(), shard.sizes().begin(), shard.sizes().end());
  at::Tensor A = flat.view(shard.scalar_type()).view(stacked).movedim(0, dim).flatten(dim, dim + 1);
  std::vector<at::Tensor> outs;
  outs.reserve(Bs.size());
  for (const at::Tensor& B : Bs) outs.push_back(at::matmul(A, B));
  return {returnA ? std::optional<at::Tensor>(A) : std::nullopt, std::move(outs)};
}

at::Tensor matmulReduceScatter(const at::Tensor& A, const at::Tensor& B, c10::string_view reduceOp,
                               int64_t scatterDim, c10::string_view groupName) {
  static constexpr const char* kOp = "fused_matmul_reduce_scatter";
  const double flops = 2.0 * static_cast<double>(A.numel()) * static_cast<double>(B.size(-1));
  const auto backend = pythonForm(flops) ? c10::intrusive_ptr<c10d::Backend>() : ferryBackend(kOp, groupName);
  if (!backend) {
    static auto composed = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("ferry::_composed_matmul_reduce_scatter", "")
                               .typed<MatmulReduceScatter>();
    return composed.call(A, B, reduceOp, scatterDim, groupName);
  }
  const bool avg = reduceOp == "avg";
  TORCH_CHECK_VALUE(avg || reduceOp == "sum", "ferry::", kOp, ": reduce_op must be 'sum' or 'avg', not '",
                    std::string(reduceOp), "'");
  const int64_t size = backend->getSize();
  const int64_t dim = wrapDim(kOp, "scatter_dim", scatterDim, A.dim());
  at::Tensor product = at::matmul(A, B);
  TORCH_CHECK_VALUE(product.size(dim) % size == 0, "ferry::", kOp, ": the result's dim ", dim, " has ",
                    product.size(dim), " rows, not a multiple of the group's ", size, " ranks");
  // As the Python body: the rows travel in the product's own dtype (one all-to-all brings this rank
  // the n blocks of its rows), then one kernel sums them in float32 and rounds once.
  at::Tensor moved = product.movedim(dim, 0).contiguous();
  at::Tensor wire = moved.view(-1).view(at::kByte);
  at::Tensor got = at::empty_like(wire);
  std::vector<int64_t> equal;  // no splits: equal blocks
  c10d::AllToAllOptions opts;
  opts.asyncOp = false;
  backend->alltoall_base(got, wire, equal, equal, opts);
  at::Tensor blocks = got.view(product.scalar_type()).view({size, -1});
  // ATen sums 16-bit floats in float32 and rounds once: a sum is one kernel, with no float32
  // temporary; a mean divides before its one rounding.
  at::Tensor acc = avg ? blocks.sum(0, /*keepdim=*/false, at::kFloat).div_(static_cast<double>(size)) : blocks.sum(0);
  std::vector<int64_t> part{moved.size(0) / size};
  part.insert(part.end(), moved.sizes().begin() + 1, moved.sizes().end());
  return acc.view(part).movedim(0, dim).to(product.scalar_type());
}

}  // namespace

void setFusedPipelineMinFlops(double flops) { pipelineMinFlops.store(flops, std::memory_order_relaxed); }

}  // namespace ferry::torch_backend

TORCH_LIBRARY_IMPL(ferry, CUDA, m) {
  m.impl("fused_all_gather_matmul", &ferry::torch_backend::allGatherMatmul);
  m.impl("fused_matmul_reduce_scatter", &ferry::torch_backend::matmulReduceScatter);
}
