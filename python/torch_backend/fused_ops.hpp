#pragma once
// The CPU and CUDA kernels of the fused ops (fused_ops.cpp).

namespace ferry::torch_backend {

// The size table's thresholds (python/ferry/torch/fused_pipeline.py, AG_AUTO_MIN_FLOPS and
// RS_AUTO_MIN_FLOPS): on a ferry group, a call whose matmuls take at least this many flops per rank
// runs pipelined (fused_pipeline.cpp).
void setFusedPipelineMinFlops(double allGather, double reduceScatter, double scaledReduceScatter);

}  // namespace ferry::torch_backend
