// The algorithms of a call across hosts and their choice (across_hosts_algorithms.hpp).
#include "comm/across_hosts_algorithms.hpp"

#include <algorithm>

#include "ferry/datatype.hpp"
#include "ferry/errors.hpp"

namespace ferry {

const char* toString(AcrossHostsAlgorithm a) {
  return a == AcrossHostsAlgorithm::Pipelined ? "across_hosts_pipelined" : "across_hosts";
}

std::optional<AcrossHostsAlgorithm> parseAcrossHostsAlgorithm(std::string_view name) {
  if (name == toString(AcrossHostsAlgorithm::Phases)) return AcrossHostsAlgorithm::Phases;
  if (name == toString(AcrossHostsAlgorithm::Pipelined)) return AcrossHostsAlgorithm::Pipelined;
  return std::nullopt;
}

std::string acrossHostsAlgorithmNames() {
  return std::string(toString(AcrossHostsAlgorithm::Phases)) + ", " + toString(AcrossHostsAlgorithm::Pipelined);
}

std::uint64_t acrossHostsUnit(std::uint64_t elementBytes, int perHost) {
  // A part of whole 16 bytes: the host's kernels move parts in vectors, and the partners' slots
  // are cut in 16 bytes.
  return static_cast<std::uint64_t>(perHost) * std::max<std::uint64_t>(1, 16 / elementBytes);
}

AcrossHostsPieces acrossHostsPieces(std::uint64_t count, std::uint64_t elementBytes, int perHost,
                                    std::uint64_t pieceBytes) {
  const std::uint64_t unit = acrossHostsUnit(elementBytes, perHost);
  const std::uint64_t units = count / unit;
  const std::uint64_t perPiece = std::max<std::uint64_t>(1, pieceBytes / elementBytes / unit);
  const std::uint64_t pieces = std::clamp<std::uint64_t>((units + perPiece - 1) / perPiece, 1, kMaxAcrossHostsPieces);
  const std::uint64_t unitsEach = (units + pieces - 1) / pieces;
  // (Rounding up can leave the last piece empty: count the pieces that hold units.)
  return {(units + unitsEach - 1) / unitsEach, unitsEach * unit};
}

std::string whyNotAcrossHosts(AcrossHostsAlgorithm a, const CollectiveCall& call, const HostLayout& layout) {
  if (a == AcrossHostsAlgorithm::Phases) return {};
  if (!layout.even) return "its hosts have different numbers of ranks";
  if (!layout.contiguous) return "a host's ranks are not consecutive world ranks";
  if (layout.columns < 2) return "its hosts have one rank each (no phase on a host to overlap with the exchange)";
  if (call.collective == Collective::AllGather || call.collective == Collective::AllToAll) return {};
  // reduceScatter cuts each rank's chunk, and reduce the buffer, into pieces of whole 16 bytes;
  // allReduce and broadcast cut each piece into a part of whole 16 bytes a rank of a host.
  const bool chunks = call.collective == Collective::ReduceScatter || call.collective == Collective::Reduce;
  const std::uint64_t unit = acrossHostsUnit(sizeOf(call.type), chunks ? 1 : layout.columns);
  if (call.count == 0 || call.count % unit != 0)
    return "its count (" + std::to_string(call.count) + ") is not a positive multiple of " + std::to_string(unit) +
           (chunks ? " (pieces of whole 16 bytes)" : " (a part of whole 16 bytes for each rank of a host)");
  return {};
}

AcrossHostsAlgorithm selectAcrossHosts(const std::vector<TuningRow>& rows, const std::string& forced,
                                       const CollectiveCall& call, const HostLayout& layout, int rank,
                                       const char* operation) {
  if (!forced.empty()) {
    const auto a = parseAcrossHostsAlgorithm(forced);
    const std::string why = a ? whyNotAcrossHosts(*a, call, layout) : "it is not one of " + acrossHostsAlgorithmNames();
    if (!why.empty()) {
      const std::string who = (rank >= 0 ? "rank " + std::to_string(rank) + ": " : std::string()) +
                              (operation != nullptr ? std::string(operation) + ": " : std::string());
      throw Error(ErrorCode::InvalidUsage, who + std::string(toString(call.collective)) + " of " +
                                               std::to_string(call.count) + " " + std::string(toString(call.type)) +
                                               ": the forced algorithm across hosts " + forced +
                                               " cannot run this call: " + why +
                                               " (force another one, or none, with setAlgorithm / FERRY_ALGO)");
    }
    return *a;
  }
  const std::uint64_t bytes = call.bytes();
  for (const TuningRow& row : rows) {
    if (!row.matchesAcrossHosts(call, layout.hosts, layout.columns) || bytes > row.maxBytes) continue;
    const auto a = parseAcrossHostsAlgorithm(row.algorithm);
    if (a && whyNotAcrossHosts(*a, call, layout).empty()) return *a;
  }
  return AcrossHostsAlgorithm::Phases;
}

}  // namespace ferry
