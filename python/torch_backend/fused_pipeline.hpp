#pragma once
// The pipelined forms of the fused ops on a group of ferry's backend whose ranks share a host
// (fused_pipeline.cpp; docs/fused.md, "The forms"): the matmul of each rank's chunk runs as soon as
// that chunk is there, and a device-side signal, not the host, says when it is.
#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "backend.hpp"

namespace ferry::torch_backend {

// Whether the pipelined forms can run a call whose A (or A_shard) is `a`, split along `dim` over the
// group's ranks: CUDA, dim 0, 2-D or 3-D (strided or not), not empty, floats cuBLAS multiplies (float32,
// float16, bfloat16), each B 2-D of a's dtype with a's last dim as its rows; and for the
// reduce-scatter (`rowsSplit`), a's rows a multiple of the ranks.
bool pipelineApplies(const FerryBackend& backend, const at::Tensor& a, at::TensorList Bs, int64_t dim,
                     bool rowsSplit);

// fused_all_gather_matmul: this rank's shard goes by the copy engines (or SM stores:
// FERRY_FUSED_COPY_BLOCKS) into every peer's workspace,
// a signal after it; this rank multiplies its own shard at once and each peer's when its signal
// has come. Returns the products (and the gathered A where returnA).
std::vector<at::Tensor> pipelinedAllGatherMatmul(FerryBackend& backend, const at::Tensor& shard,
                                                 at::TensorList Bs, bool returnA,
                                                 std::optional<at::Tensor>& gathered);

// fused_matmul_reduce_scatter: the rows each peer keeps are multiplied and go by the copy engines
// (or SM stores: FERRY_FUSED_COPY_BLOCKS) into that peer's workspace while the next rows are multiplied; then
// the n partial products of this rank's rows are summed in float32 (one kernel) and rounded once.
at::Tensor pipelinedMatmulReduceScatter(FerryBackend& backend, const at::Tensor& A, const at::Tensor& B,
                                        bool average);

// The same for fused_scaled_matmul_reduce_scatter (fp8 A and B, torch._scaled_mm's scales, bias,
// result scale and a 16- or 32-bit out dtype), scattered along the product's dim 0, of leadingRows rows:
// where scaledPipelineApplies. Returns this rank's rows of the product seen as 2-D (rows / n x N).
bool scaledPipelineApplies(const FerryBackend& backend, const at::Tensor& A, const at::Tensor& B,
                           const at::Tensor& aScale, std::optional<at::ScalarType> outDtype,
                           int64_t leadingRows);
at::Tensor pipelinedScaledMatmulReduceScatter(FerryBackend& backend, const at::Tensor& A, const at::Tensor& B,
                                              const at::Tensor& aScale, const at::Tensor& bScale,
                                              const std::optional<at::Tensor>& bias,
                                              const std::optional<at::Tensor>& resultScale,
                                              std::optional<at::ScalarType> outDtype, bool fastAccum,
                                              bool average);

}  // namespace ferry::torch_backend
