// The kernels of ferry::fused_all_gather_matmul, ferry::fused_matmul_reduce_scatter and their
// scaled (fp8) forms for CUDA and CPU tensors (python/ferry/torch/fused_ops.py defines the ops and
// says what they compute): the composition is queued from here on the group's backend for the
// tensors (ferry's, NCCL's, gloo's), on the caller's stream, with no Python between the dispatcher
// and the GPU. A Python body costs tens of microseconds of host time per call (docs/fused.md
// measured it), more than the collective itself at the smaller shapes.
//
// On a ferry group whose ranks share a host, the pipelined form runs from here too
// (fused_pipeline.cpp) where FERRY_FUSED_PIPELINE=1 or the size table of fused_pipeline.py picks
// it. The other forms go to the Python body, through the ops ferry::_composed_* that fused_ops.py
// defines with the same schemas: registered workspaces (FERRY_FUSED_REGISTERED), the pipelined form
// on other groups (FERRY_FUSED_PIPELINE=1), read per call as the Python side reads them, and a
// group with no backend for the tensors' device.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend.hpp"
#include "fused_ops.hpp"
#include "fused_pipeline.hpp"

namespace ferry::torch_backend {

namespace {

using AllGatherMatmulResult = std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>>;
using AllGatherMatmul = AllGatherMatmulResult(const at::Tensor&, at::TensorList, int64_t, c10::string_view, bool);
using MatmulReduceScatter = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, int64_t,
                                       c10::string_view);

// fused_pipeline.AG_AUTO_MIN_FLOPS, RS_AUTO_MIN_FLOPS and SCALED_RS_AUTO_MIN_FLOPS, handed over by
// fused_ops.py as it loads, so that the size table has one source. Negative until then: no call is
// pipelined for it.
std::atomic<double> allGatherMinFlops{-1.0};
std::atomic<double> reduceScatterMinFlops{-1.0};
std::atomic<double> scaledReduceScatterMinFlops{-1.0};

bool envIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// The group's backend for tensors on `device`, or null where it has none (the Python body then says
// what is wrong). Any backend: the composition needs only its all-gather and all-to-all.
c10::intrusive_ptr<c10d::Backend> groupBackend(const char* op, c10::string_view groupName, c10::DeviceType device) {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    group = c10d::resolve_process_group(std::string(groupName));
  } catch (const std::exception&) {
    TORCH_CHECK_VALUE(false, "ferry::", op, ": no process group named '", std::string(groupName),
                      "': pass group.group_name of a group made with dist.new_group (or dist.group.WORLD.group_name)");
  }
  try {
    return group->getBackend(device);
  } catch (const std::exception&) {
    return {};
  }
}

// How a call runs: the composition from here, the pipelined form from here (fused_pipeline.cpp, on
// a ferry group whose ranks share a host), or the Python body (ferry::_composed_*): no backend for
// the tensors, the registered-workspace form, or FERRY_FUSED_PIPELINE=1 where this file's pipelined
// form does not apply (another backend: the Python body pipelines on ferry.torch.symm).
enum class Form { Composition, Pipelined, Python };

// `applies`: whether fused_pipeline.cpp can run the call (pipelineApplies); `flops`: the call's
// matmul flops per rank, against the size table's threshold `min`.
Form formOf(const c10::intrusive_ptr<c10d::Backend>& backend, const std::function<bool(const FerryBackend&)>& applies,
            double flops, const std::atomic<double>& min) {
  if (!backend || envIs("FERRY_FUSED_REGISTERED", "1")) return Form::Python;
  if (envIs("FERRY_FUSED_PIPELINE", "0")) return Form::Composition;
  const auto* ferry = dynamic_cast<const FerryBackend*>(backend.get());
  const bool here = ferry != nullptr && applies(*ferry);
  if (envIs("FERRY_FUSED_PIPELINE", "1")) return here ? Form::Pipelined : Form::Python;
  const double threshold = min.load(std::memory_order_relaxed);
  return here && threshold >= 0 && flops >= threshold ? Form::Pipelined : Form::Composition;
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

// A synchronous collective's work, waited where the backend returns one: gloo's runs on its own
// thread; NCCL's backend has already ordered the caller's stream and returns none (a null work, as
// torch.distributed's Python expects of backends that "sync at the C++ level").
void waitIfAny(const c10::intrusive_ptr<c10d::Work>& work) {
  if (work) work->wait();
}

// The shards of every rank, concatenated along dim in rank order (the backend's all-gather, on the
// caller's stream).
at::Tensor allGatherRows(c10d::Backend& backend, const at::Tensor& shard, int64_t dim) {
  const int64_t size = backend.getSize();
  at::Tensor wire = onWire(shard);
  // The ranks' shards one after another along dim 0 (gloo checks that shape; the others the count).
  std::vector<int64_t> gathered(wire.sizes().begin(), wire.sizes().end());
  gathered[0] *= size;
  at::Tensor flat = at::empty(gathered, wire.options());
  c10d::AllgatherOptions opts;
  opts.asyncOp = false;  // on the caller's stream, as the matmuls after it
  waitIfAny(backend._allgather_base(flat, wire, opts));
  // flat stacks the ranks' shards along a new leading dim; move it next to `dim` and merge.
  std::vector<int64_t> stacked{size};
  stacked.insert(stacked.end(), shard.sizes().begin(), shard.sizes().end());
  return flat.view(shard.scalar_type()).view(stacked).movedim(0, dim).flatten(dim, dim + 1);
}

// This rank's part (along dim) of the sum or mean over the ranks of `product`, as the Python body
// computes it: added in float32 and rounded once. On a ferry group, ferry's reduce-scatter does
// that where the rows meet (Accumulation::Float32): one kernel, each row read once where it lies.
// On another backend, the rows travel in the product's own dtype (one all-to-all brings this rank
// the n blocks of its rows), then one kernel sums them in float32 and rounds once.
at::Tensor reduceScatterRows(c10d::Backend& backend, const char* op, const at::Tensor& product, int64_t dim,
                             c10::string_view reduceOp) {
  const bool avg = reduceOp == "avg";
  TORCH_CHECK_VALUE(avg || reduceOp == "sum", "ferry::", op, ": reduce_op must be 'sum' or 'avg', not '",
                    std::string(reduceOp), "'");
  const int64_t size = backend.getSize();
  TORCH_CHECK_VALUE(product.size(dim) % size == 0, "ferry::", op, ": the result's dim ", dim, " has ",
                    product.size(dim), " rows, not a multiple of the group's ", size, " ranks");
  at::Tensor moved = product.movedim(dim, 0).contiguous();
  std::vector<int64_t> part{moved.size(0) / size};
  part.insert(part.end(), moved.sizes().begin() + 1, moved.sizes().end());
  auto* ferry = dynamic_cast<FerryBackend*>(&backend);
  const auto t = moved.scalar_type();
  const bool ferryType = t == at::kHalf || t == at::kBFloat16 || t == at::kFloat || t == at::kDouble ||
                         t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
  if (ferry != nullptr && ferry->sumsInFloat32Here() && ferryType) {
    at::Tensor out = at::empty(part, moved.options());
    ferry->reduceScatterInFloat32(moved, out, avg, op);
    return out.movedim(0, dim);
  }
  at::Tensor wire = moved.view(-1).view(at::kByte);
  at::Tensor got = at::empty_like(wire);
  std::vector<int64_t> equal;  // no splits: equal blocks
  c10d::AllToAllOptions opts;
  opts.asyncOp = false;
  waitIfAny(backend.alltoall_base(got, wire, equal, equal, opts));
  at::Tensor blocks = got.view(product.scalar_type()).view({size, -1});
  // ATen sums 16-bit floats in float32 and rounds once: a sum is one kernel, with no float32
  // temporary; a mean divides before its one rounding.
  at::Tensor acc = avg ? blocks.sum(0, /*keepdim=*/false, at::kFloat).div_(static_cast<double>(size)) : blocks.sum(0);
  return acc.view(part).movedim(0, dim).to(product.scalar_type());
}

AllGatherMatmulResult allGatherMatmul(const at::Tensor& shard, at::TensorList Bs, int64_t gatherDim,
                                      c10::string_view groupName, bool returnA) {
  static constexpr const char* kOp = "fused_all_gather_matmul";
  const auto backend = groupBackend(kOp, groupName, shard.device().type());
  double flops = 0;  // of the gathered A's product with every B
  for (const at::Tensor& B : Bs) flops += 2.0 * static_cast<double>(shard.numel()) * B.size(-1);
  flops *= backend ? backend->getSize() : 1;
  const auto applies = [&](const FerryBackend& f) {
    return pipelineApplies(f, shard, Bs, wrapDim(kOp, "gather_dim", gatherDim, shard.dim()), false);
  };
  const Form form = formOf(backend, applies, flops, allGatherMinFlops);
  if (form == Form::Python) {
    static auto composed = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("ferry::_composed_all_gather_matmul", "")
                               .typed<AllGatherMatmul>();
    return composed.call(shard, Bs, gatherDim, groupName, returnA);
  }
  if (form == Form::Pipelined) {
    std::optional<at::Tensor> A;
    auto& ferry = static_cast<FerryBackend&>(*backend);
    std::vector<at::Tensor> outs = pipelinedAllGatherMatmul(ferry, shard, Bs, returnA, A);
    return {std::move(A), std::move(outs)};
  }
  const at::Tensor A = allGatherRows(*backend, shard, wrapDim(kOp, "gather_dim", gatherDim, shard.dim()));
  std::vector<at::Tensor> outs;
  outs.reserve(Bs.size());
  for (const at::Tensor& B : Bs) outs.push_back(at::matmul(A, B));
  return {returnA ? std::optional<at::Tensor>(A) : std::nullopt, std::move(outs)};
}

at::Tensor matmulReduceScatter(const at::Tensor& A, const at::Tensor& B, c10::string_view reduceOp,
                               int64_t scatterDim, c10::string_view groupName) {
  static constexpr const char* kOp = "fused_matmul_reduce_scatter";
  const double flops = 2.0 * static_cast<double>(A.numel()) * static_cast<double>(B.size(-1));
  const auto backend = groupBackend(kOp, groupName, A.device().type());
  const bool sumOrMean = reduceOp == "sum" || reduceOp == "avg";
  const auto applies = [&](const FerryBackend& f) {
    const int64_t dim = wrapDim(kOp, "scatter_dim", scatterDim, A.dim());
    return sumOrMean && pipelineApplies(f, A, at::TensorList(B), dim, true);
  };
  const Form form = formOf(backend, applies, flops, reduceScatterMinFlops);
  if (form == Form::Python) {
    static auto composed = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("ferry::_composed_matmul_reduce_scatter", "")
                               .typed<MatmulReduceScatter>();
    return composed.call(A, B, reduceOp, scatterDim, groupName);
  }
  if (form == Form::Pipelined)
    return pipelinedMatmulReduceScatter(static_cast<FerryBackend&>(*backend), A, B, reduceOp == "avg");
  const int64_t dim = wrapDim(kOp, "scatter_dim", scatterDim, A.dim());
  return reduceScatterRows(*backend, kOp, at::matmul(A, B), dim, reduceOp);
}

// The scaled ops: boxed kernels (they take lists of optional tensors and dtypes), with the Python
// body's semantics (fused_ops.py: _scaled_mm, _gathered_scale). Only the registered-workspace form
// and other backends go to the Python body. The reduce-scatter has a pipelined form on ferry groups
// (fused_pipeline.cpp), from fused_pipeline.SCALED_RS_AUTO_MIN_FLOPS (or FERRY_FUSED_PIPELINE=1).

std::optional<at::Tensor> optionalTensor(const c10::IValue& v) {
  return v.isNone() ? std::nullopt : std::optional<at::Tensor>(v.toTensor());
}

// A @ B of fp8 A (any leading dims) with its scales, as torch._scaled_mm computes it; where it
// cannot run (row-wise scales off CUDA), the same product of the dequantized operands.
at::Tensor scaledMm(const at::Tensor& A, const at::Tensor& B, const at::Tensor& aScale, const at::Tensor& bScale,
                    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& resultScale,
                    std::optional<at::ScalarType> outDtype, bool fastAccum) {
  const at::Tensor scale = aScale.numel() > 1 ? aScale.reshape({-1, 1}) : aScale.reshape({});
  const at::Tensor A2 = A.flatten(0, -2);
  at::Tensor out;
  if (A.is_cuda() || (aScale.numel() == 1 && bScale.numel() == 1)) {
    out = at::_scaled_mm(A2, B, scale.to(at::kFloat), bScale.to(at::kFloat), bias, resultScale, outDtype, fastAccum);
  } else {
    TORCH_CHECK(!resultScale.has_value(),
                "ferry::fused scaled ops: a result_scale with row-wise scales needs CUDA (torch._scaled_mm)");
    at::Tensor acc = at::matmul(A2.to(at::kFloat) * scale.to(at::kFloat),
                                B.to(at::kFloat) * bScale.to(at::kFloat).reshape({1, -1}));
    if (bias.has_value()) acc = acc + bias->to(at::kFloat);
    out = acc.to(outDtype.value_or(A.scalar_type()));
  }
  std::vector<int64_t> shape(A.sizes().begin(), A.sizes().end() - 1);
  shape.push_back(out.size(-1));
  return out.reshape(shape);
}

// The backend a scaled op runs on natively, or null after the Python body (ferry::_composed_<op>)
// has run the call on `stack`: another backend, or the registered-workspace form.
c10::intrusive_ptr<c10d::Backend> nativeOrComposed(const char* op, const c10::IValue& groupName,
                                                   const c10::IValue& A, torch::jit::Stack* stack) {
  auto backend = groupBackend(op, groupName.toStringRef(), A.toTensor().device().type());
  if (backend && !envIs("FERRY_FUSED_REGISTERED", "1")) return backend;
  const std::string composed = std::string("ferry::_composed_") + (op + std::strlen("fused_"));
  c10::Dispatcher::singleton().findSchemaOrThrow(composed.c_str(), "").callBoxed(stack);
  return {};
}

// (A, Bs, A_scale, B_scales, gather_dim, group_name, biases, result_scales, out_dtypes,
//  use_fast_accum) -> (A, outs)
void allGatherScaledMatmul(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack) {
  static constexpr const char* kOp = "fused_all_gather_scaled_matmul";
  constexpr std::size_t kArgs = 10;
  auto arg = [&](std::size_t i) -> const c10::IValue& { return torch::jit::peek(*stack, i, kArgs); };
  const auto backend = nativeOrComposed(kOp, arg(5), arg(0), stack);
  if (!backend) return;
  const at::Tensor shard = arg(0).toTensor();
  const std::vector<at::Tensor> Bs = arg(1).toTensorVector();
  const at::Tensor aScale = arg(2).toTensor();
  const std::vector<at::Tensor> bScales = arg(3).toTensorVector();
  const auto biases = arg(6).toListRef();
  const auto resultScales = arg(7).toListRef();
  const auto outDtypes = arg(8).toListRef();
  const c10::List<bool> fastAccum = arg(9).toBoolList();
  const std::pair<const char*, std::size_t> lists[] = {{"B_scales", bScales.size()},
                                                       {"biases", biases.size()},
                                                       {"result_scales", resultScales.size()},
                                                       {"out_dtypes", outDtypes.size()},
                                                       {"use_fast_accum", fastAccum.size()}};
  for (const auto& [what, n] : lists)
    TORCH_CHECK_VALUE(n == Bs.size(), "ferry::", kOp, ": ", what, " has ", n, " entries for ", Bs.size(), " Bs");
  const int64_t dim = wrapDim(kOp, "gather_dim", arg(4).toInt(), shard.dim());
  TORCH_CHECK_VALUE(dim != shard.dim() - 1, "ferry::", kOp,
                    ": gather_dim must not be the last (contracted) dim of an fp8 A");
  const at::Tensor A = allGatherRows(*backend, shard, dim);
  const int64_t size = backend->getSize();
  const int64_t rowsHere = shard.size(-1) > 0 ? shard.numel() / shard.size(-1) : 0;
  at::Tensor scale = aScale;  // tensor-wise, or one per row of the gathered A
  if (aScale.numel() != 1 && aScale.numel() != rowsHere * size) {
    TORCH_CHECK_VALUE(aScale.numel() == rowsHere, "ferry::", kOp, ": A_scale has ", aScale.numel(),
                      " values; expected 1 (tensor-wise), ", rowsHere, " (one per row of this rank's shard) or ",
                      rowsHere * size, " (one per row of the gathered A)");
    std::vector<int64_t> rows(shard.sizes().begin(), shard.sizes().end() - 1);
    rows.push_back(1);
    scale = allGatherRows(*backend, aScale.reshape(rows), dim);  // one per row of this shard: gathered as A is
  }
  std::vector<at::Tensor> outs;
  for (std::size_t i = 0; i < Bs.size(); ++i) {
    const std::optional<at::ScalarType> outDtype =
        outDtypes[i].isNone() ? std::nullopt : std::optional<at::ScalarType>(outDtypes[i].toScalarType());
    outs.push_back(scaledMm(A, Bs[i], scale, bScales[i], optionalTensor(biases[i]), optionalTensor(resultScales[i]),
                            outDtype, fastAccum.get(i)));
  }
  torch::jit::drop(*stack, kArgs);
  torch::jit::push(*stack, A, outs);
}

// (A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape, group_name,
//  output_shape, bias, result_scale, out_dtype, use_fast_accum) -> Tensor
void scaledMatmulReduceScatter(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack) {
  static constexpr const char* kOp = "fused_scaled_matmul_reduce_scatter";
  constexpr std::size_t kArgs = 13;
  auto arg = [&](std::size_t i) -> const c10::IValue& { return torch::jit::peek(*stack, i, kArgs); };
  const auto backend = nativeOrComposed(kOp, arg(7), arg(0), stack);
  if (!backend) return;
  const std::string reduceOp = arg(4).toStringRef();
  const std::optional<at::ScalarType> outDtype =
      arg(11).isNone() ? std::nullopt : std::optional<at::ScalarType>(arg(11).toScalarType());
  const at::Tensor A = arg(0).toTensor(), B = arg(1).toTensor(), aScale = arg(2).toTensor();
  // The product's shape: PyTorch's async-TP pass may hand over A reshaped to 2-D (its rows then hold
  // the original leading dims), with the original shape in output_shape; else A's leading dims.
  std::vector<int64_t> shape(A.sizes().begin(), A.sizes().end() - 1);
  if (!arg(8).isNone()) {
    shape.clear();
    for (const c10::IValue& v : arg(8).toListRef())
      shape.push_back(v.isInt() ? v.toInt() : v.toSymInt().guard_int(__FILE__, __LINE__));
    TORCH_CHECK_VALUE(!shape.empty(), "ferry::", kOp, ": output_shape is empty");
    shape.pop_back();
  }
  shape.push_back(B.size(-1));
  const int64_t dim = wrapDim(kOp, "orig_scatter_dim", arg(5).toInt(), static_cast<int64_t>(shape.size()));
  // Pipelined as the size table says: on a ferry group of one host, scattered along the product's
  // dim 0 (fused_pipeline.cpp). Where it does not apply, FERRY_FUSED_PIPELINE=1 (Form::Python)
  // runs the composition too: the Python body has no pipelined scaled form.
  auto* ferry = dynamic_cast<FerryBackend*>(backend.get());
  const bool sumOrMean = reduceOp == "sum" || reduceOp == "avg";
  const auto applies = [&](const FerryBackend& f) {
    return dim == 0 && sumOrMean && scaledPipelineApplies(f, A, B, aScale, outDtype, shape[0]);
  };
  const double flops = 2.0 * static_cast<double>(A.numel()) * static_cast<double>(B.size(-1));
  if (formOf(backend, applies, flops, scaledReduceScatterMinFlops) == Form::Pipelined) {
    at::Tensor part =
        pipelinedScaledMatmulReduceScatter(*ferry, A, B, aScale, arg(3).toTensor(), optionalTensor(arg(9)),
                                           optionalTensor(arg(10)), outDtype, arg(12).toBool(), reduceOp == "avg");
    shape[0] /= ferry->getSize();
    torch::jit::drop(*stack, kArgs);
    torch::jit::push(*stack, part.view(shape));
    return;
  }
  at::Tensor C = scaledMm(A, B, aScale, arg(3).toTensor(), optionalTensor(arg(9)), optionalTensor(arg(10)), outDtype,
                          arg(12).toBool())
                     .view(shape);
  at::Tensor part = reduceScatterRows(*backend, kOp, C, dim, reduceOp);
  torch::jit::drop(*stack, kArgs);
  torch::jit::push(*stack, std::move(part));
}

}  // namespace

void setFusedPipelineMinFlops(double allGather, double reduceScatter, double scaledReduceScatter) {
  allGatherMinFlops.store(allGather, std::memory_order_relaxed);
  reduceScatterMinFlops.store(reduceScatter, std::memory_order_relaxed);
  scaledReduceScatterMinFlops.store(scaledReduceScatter, std::memory_order_relaxed);
}

}  // namespace ferry::torch_backend

namespace ferry::torch_backend {
namespace {

void registerKernels(torch::Library& m) {
  m.impl("fused_all_gather_matmul", &allGatherMatmul);
  m.impl("fused_matmul_reduce_scatter", &matmulReduceScatter);
  m.impl("fused_all_gather_scaled_matmul", torch::CppFunction::makeFromBoxedFunction<&allGatherScaledMatmul>());
  m.impl("fused_scaled_matmul_reduce_scatter",
         torch::CppFunction::makeFromBoxedFunction<&scaledMatmulReduceScatter>());
}

}  // namespace
}  // namespace ferry::torch_backend

// CPU too: the same composition on the group's CPU backend (gloo), which is what the tests without
// a GPU run.
TORCH_LIBRARY_IMPL(ferry, CUDA, m) { ferry::torch_backend::registerKernels(m); }
TORCH_LIBRARY_IMPL(ferry, CPU, m) { ferry::torch_backend::registerKernels(m); }
