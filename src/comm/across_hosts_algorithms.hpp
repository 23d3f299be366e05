#pragma once
// The algorithms of a call across hosts (docs/multi-node.md, "Algorithms across hosts"). A call of a
// Comm across hosts runs as phases on this host's Comm and exchanges among the partners
// (comm_across_hosts.cpp); these are the ways of composing them, chosen as a host's algorithms are:
// by the tuning table, from its rows that name hosts (TuningRow::hosts, keyed by hosts x ranks per
// host), the first that matches the call and whose algorithm can run it; where none does, phases.
//   across_hosts            every collective, any layout: the whole buffer on the host, a column's
//                           part across the partners, then the host again (comm_across_hosts.cpp
//                           says how for each collective).
//   across_hosts_pipelined  allReduce, where hosts have one size and 2 or more ranks each, whose ranks
//                           are consecutive, and the count splits into parts of whole 16 bytes, one
//                           a rank of a host: in pieces (FERRY_ACROSS_HOSTS_PIECE), a reduceScatter of
//                           the piece on the host, an allReduce of this rank's part of it across the
//                           partners, an allGather of the parts on the host. The exchange of piece k
//                           runs on a stream of its own while the host reduces piece k + 1 and
//                           gathers piece k - 1, so the network and NVLink work at once; each part
//                           crosses the network once, and a host moves a piece twice, not three times.
//                           allGather on such hosts (any count): the exchange of this rank's own
//                           chunk on that stream while the host gathers its ranks' chunks, then the
//                           host gathers the other hosts' (the exchange needs nothing of the first).
//                           broadcast, in the allReduce's pieces and parts: the root's host sends
//                           piece k's parts while it broadcasts piece k + 1, the other hosts gather
//                           piece k's parts while piece k + 1's arrive.
//                           reduceScatter, in pieces of each rank's chunk (counts of whole 16
//                           bytes): the host reduces and scatters piece k + 1 while the partners
//                           exchange and sum their partials of piece k.
//                           allToAll (any count): the exchange with the partners on that stream
//                           while the host exchanges its own ranks' chunks, then the host
//                           exchanges what the other hosts sent.
//                           reduce, in pieces of the buffer (counts of whole 16 bytes): each host
//                           reduces piece k + 1 to the rank carrying the root's column while that
//                           rank sends its partial sum of piece k to the root.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/host_layout.hpp"
#include "comm/selector.hpp"
#include "kernels/collective_call.hpp"

namespace ferry {

enum class AcrossHostsAlgorithm : std::uint8_t { Phases, Pipelined };

const char* toString(AcrossHostsAlgorithm a);
// The algorithm of that name (every collective has both); nullopt where none is.
std::optional<AcrossHostsAlgorithm> parseAcrossHostsAlgorithm(std::string_view name);
// The names of the algorithms across hosts, separated by ", " (for errors).
std::string acrossHostsAlgorithmNames();

// Where the pipelined allReduce's pieces and parts lie: `pieces` pieces of `pieceCount` elements
// (the last one shorter), each cut into one part a rank of a host.
struct AcrossHostsPieces {
  std::uint64_t pieces = 0, pieceCount = 0;
};
// The pieces of `count` elements of `elementBytes` bytes on hosts of `perHost` ranks, each piece
// about `pieceBytes` (at most kMaxAcrossHostsPieces of them) and a whole number of parts.
// @pre count is a whole number of units (acrossHostsUnit)
inline constexpr std::uint64_t kMaxAcrossHostsPieces = 64;
std::uint64_t acrossHostsUnit(std::uint64_t elementBytes, int perHost);
AcrossHostsPieces acrossHostsPieces(std::uint64_t count, std::uint64_t elementBytes, int perHost,
                                    std::uint64_t pieceBytes);

// "" where `a` can run `call` (the world's call: count, type, world ranks) on `layout`; else why not.
std::string whyNotAcrossHosts(AcrossHostsAlgorithm a, const CollectiveCall& call, const HostLayout& layout);

// The algorithm forced for the call's collective (`forced`: setAlgorithm or FERRY_ALGO; a forced one
// that cannot run the call is Error(InvalidUsage) saying why, naming `rank` and `operation` where
// given: the text is made only then, not on every call); else the first of `rows` that names hosts,
// matches the call on `layout` and names an algorithm that can run it; Phases where none does.
AcrossHostsAlgorithm selectAcrossHosts(const std::vector<TuningRow>& rows, const std::string& forced,
                                       const CollectiveCall& call, const HostLayout& layout, int rank = -1,
                                       const char* operation = nullptr);

}  // namespace ferry
