#pragma once
// PreMulSum calls (datatype.hpp): each rank first scales its input by its factor, then the Comm's
// ordinary sum algorithms run on the scaled copy. The scaled copy of an allReduce goes to recv, so
// the sum runs in place there; a reduceScatter's input is larger than its output, and a reduce's
// non-root has no output, so theirs goes to a buffer of the Comm (CommScratch).
//
//   void* scaled = scratch.reserve(bytes, call);   // grows outside graph captures only
//   launchPreMul(scaled, call.send, call.sendElements(), call.type, op, call.stream);
//   // ...then the sum, from `scaled`
//
// Every rank scales into the same kind of buffer, so the sum's buffers are registered on every
// rank or on none, as its algorithms need.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/collective_call.hpp"
#include "ferry/datatype.hpp"

namespace ferry {

// Queues dst[i] = factor * src[i] (rounded to `type`; integers wrap) for i < count on `stream`, in
// at most maxBlocks thread blocks (the Comm's bound). dst == src is allowed. A host factor is read
// now, a device factor when the kernel runs.
void launchPreMul(void* dst, const void* src, std::size_t count, DataType type, const PreMulSum& op,
                  int maxBlocks, cudaStream_t stream);
// Loads the scaling kernels now (launch.hpp's preloadKernel says why).
void preloadPreMul();

}  // namespace ferry
