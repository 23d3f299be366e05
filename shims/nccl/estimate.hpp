#pragma once
// ncclGroupSimulateEnd's time estimate for one call (docs/nccl.md): the algorithm ferry's selector
// would pick for it (Comm::algorithmFor), then a two-regime model, latency + bus bytes / bandwidth,
// fitted to ferry's own allreduce measured on 2 H200 over NVSwitch (docs/measurements/
// h200x2-2026-11-24.md: LL packets 4.1 us at 1 KiB, 4.4 us at 64 KiB; the Simple protocol 12.4 us
// at 1 MiB, 341 GB/s of bus bandwidth at 1 GiB). Other machines are slower or faster; the
// estimate is for comparing groups, as NCCL's is.
#include <cstddef>
#include <optional>
#include <string_view>

#include "ferry/collective.hpp"
#include "ferry/datatype.hpp"

namespace ferry::nccl {

// One call of a group: a collective of `bytes` (its largest buffer: the gathered output, the
// scattered input, the whole all-to-all buffer), or the sends of a group's point-to-point work
// (`collective` empty, `bytes` their total), of data type `type`.
struct CallCost {
  std::optional<Collective> collective;
  std::size_t bytes = 0;
  DataType type = DataType::Uint8;
};

// Microseconds for `call` run by `algorithm` over `nranks` ranks.
double estimateMicroseconds(const CallCost& call, std::string_view algorithm, int nranks);

}  // namespace ferry::nccl
