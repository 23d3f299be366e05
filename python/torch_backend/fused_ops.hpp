#pragma once
// The CPU and CUDA kernels of the fused ops (fused_ops.cpp).

namespace ferry::torch_backend {

// The size table's threshold (python/ferry/torch/fused_pipeline.py, RS_AUTO_MIN_FLOPS): a matmul +
// reduce-scatter of at least this many flops per rank goes to the Python body, which pipelines it.
void setFusedPipelineMinFlops(double flops);

}  // namespace ferry::torch_backend
