#pragma once
// Where the ranks of a Comm across hosts live (docs/multi-node.md, "A Comm across hosts"): each
// world rank's host (its partner index) and local rank, and each host's lowest world rank. Every
// rank holds the same table (gathered when the Comm is made), so what it decides from it, every
// rank decides alike.
#include <utility>
#include <vector>

namespace ferry {

struct HostLayout {
  int hosts = 1;
  int ranksPerHost = 1;        // the same on every host (checked when the Comm is made)
  std::vector<int> hostOf;     // by world rank
  std::vector<int> localOf;    // by world rank: its rank among its host's ranks
  std::vector<int> firstOf;    // by host: its lowest world rank
  // Each host's ranks are consecutive world ranks, in local order (as torchrun and mpirun number
  // them): a host's part of an allGather, reduceScatter or allToAll buffer is then one block.
  bool contiguous = false;

  HostLayout() = default;
  // From every world rank's host and local rank.
  HostLayout(std::vector<int> host, std::vector<int> local, int hostCount, int perHost)
      : hosts(hostCount), ranksPerHost(perHost), hostOf(std::move(host)), localOf(std::move(local)),
        firstOf(static_cast<std::size_t>(hostCount), -1) {
    for (int r = static_cast<int>(hostOf.size()) - 1; r >= 0; --r) firstOf[static_cast<std::size_t>(hostOf[r])] = r;
    contiguous = true;
    for (std::size_t r = 0; r < hostOf.size(); ++r)
      contiguous = contiguous && static_cast<int>(r) == firstOf[static_cast<std::size_t>(hostOf[r])] + localOf[r];
  }
};

}  // namespace ferry
