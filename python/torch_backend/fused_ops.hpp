#pragma once
// The CPU and CUDA kernels of the fused ops (fused_ops.cpp).

namespace ferry::torch_backend {

// The size table's thresholds (python/ferry/torch/fused_pipeline.py, AG_AUTO_MIN_FLOPS,
// RS_AUTO_MIN_FLOPS and SCALED_RS_AUTO_MIN_FLOPS): on a ferry group, a call whose matmuls take at
// least this many flops per rank runs pipelined (fused_pipeline.cpp). Every rank reads the same
// file, and a call's shape is the same on every rank, so the ranks pick the same form.
void setFusedPipelineMinFlops(double allGather, double reduceScatter, double scaledReduceScatter);

}  // namespace ferry::torch_backend
