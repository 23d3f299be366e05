#pragma once
// The collectives, by name: ferry's shared vocabulary with DataType and ReduceOp (datatype.hpp).
#include <optional>
#include <string_view>

#include "ferry/api.hpp"

namespace ferry {

enum class Collective : int { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, Reduce };
inline constexpr int kCollectiveCount = 6;
// "allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce".
FERRY_API std::string_view toString(Collective c) noexcept;
// The names above; also with '_' ("all_reduce"), case-insensitively.
FERRY_API std::optional<Collective> parseCollective(std::string_view name) noexcept;

}  // namespace ferry
