// The pipelined fused ops on a ferry group (fused_pipeline.hpp). Every rank's workspace is the
// group's symmetric memory (FusedWorkspace, through FerryBackend::beginFused, which also orders a
// call made on another stream after the previous one): slot p of rank q's workspace holds what
// rank p sent rank q. Data moves by copies pushed to the peer (SymmetricMemory::put into its mapped
// workspace: by the copy engines, which leave the SMs to the matmuls, or with FERRY_FUSED_COPY_BLOCKS
// by SM stores on that many blocks), on a side stream per peer, so that the copies to different
// peers run side by side; a signal-pad flag follows each copy on its stream, and
// the receiver's matmul of that chunk waits for the flag in a one-thread kernel on the caller's
// stream: the host never waits, and the whole call can be captured in a CUDA graph.
//
// A call starts with a barrier on channel 0: every rank's stream has passed it only after every
// kernel of its previous call (the side streams are joined to it, and a call on another stream
// waits for the previous call's end), so no peer still reads or sums a slot this call's copies
// overwrite, and no closing barrier is needed. Channel 1 carries the data
// signals: one per pair and call, each consumed by its wait before the next can be set.
#include "fused_pipeline.hpp"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/errors.hpp"

namespace ferry::torch_backend {

namespace {

constexpr int kStartChannel = 0;  // the call's opening barrier
constexpr int kDataChannel = 1;   // "the chunk from me is in your workspace"

// `from`'s work so far comes before what is queued on `to` next (an event, no host wait).
void order(const c10::cuda::CUDAStream& from, const c10::cuda::CUDAStream& to) {
  at::cuda::CUDAEvent done;
  done.record(from);
  done.block(to);
}

// The side streams a call forked from `cur`, joined back to it when the call's queuing ends, also
// when it ends in an error (a failed allocation, a refused launch): a capture must not end with a
// stream left forked, and the caller's next work must come after the copies that read its tensors.
struct Forked {
  const c10::cuda::CUDAStream& cur;
  std::vector<c10::cuda::CUDAStream> sides;
  ~Forked() {
    for (const auto& side : sides) {
      try {
        order(side, cur);
      } catch (...) {  // (already failing: the first error is the one reported)
      }
    }
  }
};

// Every wait of these kernels gives up after FERRY_DEVICE_TIMEOUT (zero: SymmetricMemory's
// default), as the Comm's own do, naming the rank it waited for; the host sees the error at its
// next synchronisation.
constexpr std::chrono::duration<double> kWaitBound{0};

// rows x cols of `like`'s dtype at `address` (a slot of a workspace), owned by the workspace.
at::Tensor slotView(void* address, int64_t rows, int64_t cols, const at::Tensor& like) {
  return at::from_blob(address, {rows, cols}, like.options());
}

// a @ b into `out`, a view of a larger tensor (rows of the output, a workspace slot).
void mmInto(at::Tensor out, const at::Tensor& a, const at::Tensor& b) { at::mm_out(out, a, b); }

char* slotAddress(const SymmetricMemory& ws, int rank, int slot, std::size_t slotBytes) {
  return static_cast<char*>(ws.bufferPtrs()[rank]) + static_cast<std::size_t>(slot) * slotBytes;
}

// How a chunk travels (FERRY_FUSED_COPY_BLOCKS, read per call as the env of the other forms is):
// unset or 0, by the copy engines; a number of thread blocks, by SM stores on that many blocks of the
// side stream (SymmetricMemory::put), which take SMs from the matmul beside them but are not held
// to one copy engine's rate.
int copyBlocks() {
  const char* v = std::getenv("FERRY_FUSED_COPY_BLOCKS");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long blocks = std::strtol(v, &end, 10);
  TORCH_CHECK_VALUE(*end == '\0' && blocks >= 0 && blocks <= 1024, "FERRY_FUSED_COPY_BLOCKS='", v,
                    "' is not valid: expected a number of thread blocks in [0, 1024] (0: the copy engines)");
  return static_cast<int>(blocks);
}

// Copies `bytes` of `keep` into slot `slot` of rank `peer`'s workspace on `stream`, then signals
// `peer` on the data channel after it; `keep`'s memory stays out of the allocator's hands until the
// stream is done with it.
void push(const SymmetricMemory& ws, int peer, int slot, const at::Tensor& keep, std::size_t bytes,
          int blocks, const c10::cuda::CUDAStream& stream, std::chrono::duration<double> bound) {
  ws.put(peer, static_cast<std::size_t>(slot) * bytes, keep.data_ptr(), bytes, blocks, stream.stream());
  ws.putSignal(peer, kDataChannel, bound, stream.stream());
  c10::cuda::CUDACachingAllocator::recordStream(keep.storage().data_ptr(), stream);
}

// Runs body; a ferry::Error (a bad signal argument, a failed launch) becomes torch's
// DistBackendError naming the rank and the op, as the backend's other ops do.
template <typename Body>
auto guarded(const FerryBackend& backend, const char* op, Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, "ferry backend: rank " + std::to_string(backend.getRank()) + ": " + op +
                                          " (pipelined): " + e.what());
  }
}

}  // namespace

bool pipelineApplies(const FerryBackend& backend, const at::Tensor& a, at::TensorList Bs, int64_t dim,
                     bool rowsSplit) {
  const int64_t n = backend.getSize();
  const auto t = a.scalar_type();
  // (Not contiguity: every rank must pick the same form from the call's shape, and a strided A is
  // made contiguous first.)
  if (!a.is_cuda() || a.device().index() != backend.device() || dim != 0 || (a.dim() != 2 && a.dim() != 3) ||
      a.numel() == 0 || n < 2 || !backend.sumsInFloat32Here() ||
      (t != at::kFloat && t != at::kHalf && t != at::kBFloat16))
    return false;
  if (rowsSplit && a.size(0) % n != 0) return false;
  for (const at::Tensor& B : Bs)
    if (B.dim() != 2 || B.scalar_type() != t || B.size(0) != a.size(-1) || B.size(1) == 0 ||
        B.device() != a.device())
      return false;
  return !Bs.empty();
}

std::vector<at::Tensor> pipelinedAllGatherMatmul(FerryBackend& backend, const at::Tensor& given,
                                                 at::TensorList Bs, bool returnA,
                                                 std::optional<at::Tensor>& gathered) {
  static constexpr const char* kOp = "fused_all_gather_matmul";
  const at::Tensor shard = given.contiguous();  // (its bytes go to the peers as they lie)
  const int n = backend.getSize(), r = backend.getRank();
  const c10::DeviceIndex device = shard.device().index();
  c10::cuda::CUDAGuard guard(device);
  const int64_t k = shard.size(-1), rows = shard.numel() / k;  // a shard's rows, leading dims merged
  const std::size_t slotBytes = shard.nbytes();
  const auto bound = kWaitBound;
  const int blocks = copyBlocks();
  const c10::cuda::CUDAStream cur = c10::cuda::getCurrentCUDAStream(device);
  const at::Tensor a = shard.view({rows, k});

  std::vector<int64_t> gatheredShape(shard.sizes().begin(), shard.sizes().end());
  gatheredShape[0] *= n;
  std::vector<at::Tensor> outs, flat;
  for (const at::Tensor& B : Bs) {
    std::vector<int64_t> shape(gatheredShape.begin(), gatheredShape.end() - 1);
    shape.push_back(B.size(1));
    outs.push_back(at::empty(shape, shard.options()));
    flat.push_back(outs.back().view({n * rows, B.size(1)}));
  }
  at::Tensor A;
  if (returnA) A = at::empty(gatheredShape, shard.options());
  const at::Tensor A2 = returnA ? A.view({n * rows, k}) : at::Tensor();

  const auto held = backend.beginFused(static_cast<std::size_t>(n) * slotBytes, cur.stream(), kOp);
  const SymmetricMemory& ws = *held;
  guarded(backend, kOp, [&] {
    Forked forked{cur, {}};
    ws.barrier(kStartChannel, bound, cur.stream());
    // Step s sends to rank r + s, which waits for rank r at its step s: the first chunk each rank
    // waits for is the first one sent to it.
    for (int step = 1; step < n; ++step) {
      const int dst = (r + step) % n;
      forked.sides.push_back(backend.fusedSide(step));
      order(cur, forked.sides.back());  // after the barrier, and after whatever wrote the shard
      push(ws, dst, r, shard, slotBytes, blocks, forked.sides.back(), bound);
    }
    for (std::size_t i = 0; i < Bs.size(); ++i) mmInto(flat[i].narrow(0, r * rows, rows), a, Bs[i]);
    if (returnA) A2.narrow(0, r * rows, rows).copy_(a);
    for (int step = 1; step < n; ++step) {
      const int src = (r - step + n) % n;
      ws.waitSignal(src, kDataChannel, bound, cur.stream());
      const at::Tensor chunk = slotView(slotAddress(ws, r, src, slotBytes), rows, k, shard);
      for (std::size_t i = 0; i < Bs.size(); ++i) mmInto(flat[i].narrow(0, src * rows, rows), chunk, Bs[i]);
      if (returnA) A2.narrow(0, src * rows, rows).copy_(chunk);
    }
    return 0;  // (forked joins the side streams: the shard's reads are over when the op is)
  });
  backend.endFused(cur.stream());
  gathered = returnA ? std::optional<at::Tensor>(A) : std::nullopt;
  return outs;
}

namespace {

// Writes rows [first, first + rows) of a product into `out` (fused_pipeline.hpp's reduce-scatters).
using MultiplyRows = std::function<void(const at::Tensor& out, int64_t first, int64_t rows)>;

// The pipelined matmul + reduce-scatter of any product: `multiply(out, first, rows)` writes rows
// [first, first + rows) of the product (rows of A seen as 2-D, leading dims merged) into `out`, a
// rows x cols tensor of `options`. Returns this rank's part, rows / n x cols: the n partial products
// of its rows summed in float32 and rounded once (a mean: divided before the rounding).
at::Tensor pipelinedReduceScatterOf(FerryBackend& backend, const char* op, int64_t rowsTotal, int64_t cols,
                                    const at::TensorOptions& options, const MultiplyRows& multiply,
                                    bool average) {
  const int n = backend.getSize(), r = backend.getRank();
  const c10::DeviceIndex device = options.device().index();
  c10::cuda::CUDAGuard guard(device);
  const int64_t rows = rowsTotal / n;  // the rows each rank keeps
  const auto dtype = c10::typeMetaToScalarType(options.dtype());
  const std::size_t slotBytes = static_cast<std::size_t>(rows * cols) * c10::elementSize(dtype);
  const auto bound = kWaitBound;
  const int blocks = copyBlocks();
  const c10::cuda::CUDAStream cur = c10::cuda::getCurrentCUDAStream(device);
  // Every product a peer gets, allocated before the barrier: a failure after it would leave the
  // peers waiting for this rank's signals until FERRY_DEVICE_TIMEOUT.
  std::vector<at::Tensor> products;
  for (int step = 1; step < n; ++step) products.push_back(at::empty({rows, cols}, options));

  const auto held = backend.beginFused(static_cast<std::size_t>(n) * slotBytes, cur.stream(), op);
  const SymmetricMemory& ws = *held;
  return guarded(backend, op, [&] {
    Forked forked{cur, {}};
    ws.barrier(kStartChannel, bound, cur.stream());
    for (int step = 1; step < n; ++step) {
      const int dst = (r + step) % n;
      const at::Tensor& product = products[static_cast<std::size_t>(step - 1)];
      multiply(product, dst * rows, rows);
      forked.sides.push_back(backend.fusedSide(step));
      order(cur, forked.sides.back());  // the product is made, and the barrier passed
      push(ws, dst, r, product, slotBytes, blocks, forked.sides.back(), bound);
    }
    // This rank's own rows go straight into its own slot, while the last copies are in flight.
    multiply(at::from_blob(slotAddress(ws, r, r, slotBytes), {rows, cols}, options), r * rows, rows);
    for (int step = 1; step < n; ++step) ws.waitSignal((r - step + n) % n, kDataChannel, bound, cur.stream());
    // The n products of this rank's rows lie side by side. ATen sums 16-bit floats in float32 and
    // rounds once (one kernel); a mean divides before its one rounding.
    const at::Tensor slots = at::from_blob(ws.bufferPtrs()[r], {n, rows * cols}, options);
    at::Tensor sum = average
                         ? slots.sum(0, /*keepdim=*/false, at::kFloat).div_(static_cast<double>(n)).to(dtype)
                         : slots.sum(0);
    return sum.view({rows, cols});
  });  // (forked joined the side streams after the sum was queued)
}

}  // namespace

at::Tensor pipelinedMatmulReduceScatter(FerryBackend& backend, const at::Tensor& A, const at::Tensor& B,
                                        bool average) {
  static constexpr const char* kOp = "fused_matmul_reduce_scatter";
  const int64_t k = A.size(-1), cols = B.size(1);
  const at::Tensor a = A.contiguous().view({-1, k});
  const auto multiply = [&](const at::Tensor& out, int64_t first, int64_t rows) {
    mmInto(out, a.narrow(0, first, rows), B);
  };
  at::Tensor part = pipelinedReduceScatterOf(backend, kOp, a.size(0), cols, A.options(), multiply, average);
  backend.endFused(c10::cuda::getCurrentCUDAStream(A.device().index()).stream());
  std::vector<int64_t> shape(A.sizes().begin(), A.sizes().end() - 1);
  shape[0] /= backend.getSize();
  shape.push_back(cols);
  return part.view(shape);
}

bool scaledPipelineApplies(const FerryBackend& backend, const at::Tensor& A, const at::Tensor& B,
                           const at::Tensor& aScale, std::optional<at::ScalarType> outDtype,
                           int64_t leadingRows) {
  const int64_t n = backend.getSize();
  const bool fp8 = [](at::ScalarType t) {
    return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
  }(A.scalar_type());
  const int64_t rows = A.numel() / std::max<int64_t>(A.size(-1), 1);
  // The partial products are summed by ATen in float32: products of 16 or 32 bits, not fp8.
  const bool wide = outDtype == at::kBFloat16 || outDtype == at::kHalf || outDtype == at::kFloat;
  return fp8 && wide && A.is_cuda() && A.device().index() == backend.device() && A.numel() > 0 &&
         (A.dim() == 2 || A.dim() == 3) && B.dim() == 2 && B.size(1) > 0 &&
         B.device() == A.device() && n > 1 && backend.sumsInFloat32Here() && leadingRows % n == 0 &&
         rows % n == 0 && (aScale.numel() == 1 || aScale.numel() == rows);
}

at::Tensor pipelinedScaledMatmulReduceScatter(FerryBackend& backend, const at::Tensor& A, const at::Tensor& B,
                                              const at::Tensor& aScale, const at::Tensor& bScale,
                                              const std::optional<at::Tensor>& bias,
                                              const std::optional<at::Tensor>& resultScale,
                                              std::optional<at::ScalarType> outDtype, bool fastAccum,
                                              bool average) {
  static constexpr const char* kOp = "fused_scaled_matmul_reduce_scatter";
  const at::Tensor a = A.contiguous().view({-1, A.size(-1)});
  const bool rowwise = aScale.numel() > 1;
  const at::Tensor scaleA = (rowwise ? aScale.reshape({-1, 1}) : aScale.reshape({})).to(at::kFloat);
  const at::Tensor scaleB = bScale.to(at::kFloat);
  const auto multiply = [&](const at::Tensor& out, int64_t first, int64_t rows) {
    at::Tensor target = out;
    at::_scaled_mm_out(target, a.narrow(0, first, rows), B, rowwise ? scaleA.narrow(0, first, rows) : scaleA,
                       scaleB, bias, resultScale, outDtype, fastAccum);
  };
  const auto options = A.options().dtype(outDtype.value_or(A.scalar_type()));
  at::Tensor part = pipelinedReduceScatterOf(backend, kOp, a.size(0), B.size(1), options, multiply, average);
  backend.endFused(c10::cuda::getCurrentCUDAStream(A.device().index()).stream());
  return part;
}

}  // namespace ferry::torch_backend
