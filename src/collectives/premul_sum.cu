// The scaling pass of PreMulSum calls: one element-wise kernel, 16 bytes per thread and step where
// both pointers allow it.
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "collectives/premul_sum.hpp"
#include "platform/cuda_check.hpp"

namespace ferry {
namespace {

// The factor as the kernel gets it: its bytes (read on the host at the call) or where to read them.
struct Factor {
  std::uint64_t bits = 0;
  const void* onDevice = nullptr;
};

template <class T>
FERRY_DEVICE FERRY_INLINE T factorValue(const Factor& f) {
  T v;
  if (f.onDevice != nullptr)
    v = *static_cast<const T*>(f.onDevice);
  else
    memcpy(&v, &f.bits, sizeof(T));
  return v;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    preMulKernel(T* dst, const T* src, std::uint64_t count, Factor f) {
  const T factor = factorValue<T>(f);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * kThreads;
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
  constexpr int n = sizeof(Vec16) / sizeof(T);
  std::uint64_t vectors = 0;
  if (aligned(dst, 16) && aligned(src, 16)) {
    vectors = count / n;
    for (std::uint64_t v = first; v < vectors; v += stride) {
      Vec16 w = reinterpret_cast<const Vec16*>(src)[v];
      T x[n];
      memcpy(x, &w, sizeof w);
#pragma unroll
      for (int i = 0; i < n; ++i) x[i] = applyOp<ReduceOp::Prod>(x[i], factor);
      memcpy(&w, x, sizeof w);
      reinterpret_cast<Vec16*>(dst)[v] = w;
    }
  }
  for (std::uint64_t i = vectors * n + first; i < count; i += stride)
    dst[i] = applyOp<ReduceOp::Prod>(src[i], factor);
}

}  // namespace

void preloadPreMul() {
  for (int t = 0; t < kDataTypeCount; ++t)
    dispatchTypeOp(static_cast<DataType>(t), ReduceOp::Sum,
                   [&]<class T, ReduceOp>() { preloadKernel(preMulKernel<T>); });
}

void launchPreMul(void* dst, const void* src, std::size_t count, DataType type, const PreMulSum& op,
                  int maxBlocks, cudaStream_t stream) {
  Factor f;
  if (op.onDevice)
    f.onDevice = op.factor;
  else
    memcpy(&f.bits, op.factor, sizeOf(type));
  dispatchTypeOp(type, ReduceOp::Sum, [&]<class T, ReduceOp>() {
    // Enough blocks to keep every SM's memory pipeline full; more only add launch work.
    const unsigned blocks =
        gridFor(count * sizeof(T), std::uint64_t{64} << 10, 1, static_cast<unsigned>(maxBlocks));
    preMulKernel<T>
        <<<blocks, kThreads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), count, f);
  });
  FERRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ferry
