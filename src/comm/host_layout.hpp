#pragma once
// Where the ranks of a Comm across hosts live (docs/multi-node.md, "A Comm across hosts"): each
// world rank's host (its partner index) and local rank, each host's ranks, and the columns of the
// cross-host phase. Every rank holds the same table (gathered when the Comm is made), so what it
// decides from it, every rank decides alike.
//
// Columns: a call's cross-host part is cut into `columns` parts (the most ranks any host has); on
// host h, local rank c % sizeOf[h] carries part c, so on hosts of equal size rank l carries part l
// alone, and on a smaller host a rank carries several (3 + 1 ranks: the lone rank carries all three).
#include <utility>
#include <vector>

namespace ferry {

struct HostLayout {
  int hosts = 1;
  std::vector<int> hostOf;   // by world rank
  std::vector<int> localOf;  // by world rank: its rank among its host's ranks
  std::vector<int> firstOf;  // by host: its lowest world rank
  std::vector<int> sizeOf;   // by host: how many ranks it has
  int columns = 1;           // the most ranks a host has
  bool even = true;          // every host has as many ranks
  // Each host's ranks are consecutive world ranks, in local order (as torchrun and mpirun number
  // them): a host's part of an allGather, reduceScatter or allToAll buffer is then one block.
  bool contiguous = false;

  HostLayout() = default;
  // From every world rank's host and local rank.
  HostLayout(std::vector<int> host, std::vector<int> local, int hostCount)
      : hosts(hostCount), hostOf(std::move(host)), localOf(std::move(local)),
        firstOf(static_cast<std::size_t>(hostCount), -1), sizeOf(static_cast<std::size_t>(hostCount), 0),
        rankAt_(static_cast<std::size_t>(hostCount)) {
    for (int r = static_cast<int>(hostOf.size()) - 1; r >= 0; --r) firstOf[static_cast<std::size_t>(hostOf[r])] = r;
    for (std::size_t r = 0; r < hostOf.size(); ++r) {
      auto& at = rankAt_[static_cast<std::size_t>(hostOf[r])];
      if (at.size() <= static_cast<std::size_t>(localOf[r])) at.resize(static_cast<std::size_t>(localOf[r]) + 1, -1);
      at[static_cast<std::size_t>(localOf[r])] = static_cast<int>(r);
      ++sizeOf[static_cast<std::size_t>(hostOf[r])];
    }
    contiguous = true;
    for (std::size_t r = 0; r < hostOf.size(); ++r)
      contiguous = contiguous && static_cast<int>(r) == firstOf[static_cast<std::size_t>(hostOf[r])] + localOf[r];
    columns = 0;
    for (int s : sizeOf) columns = s > columns ? s : columns;
    for (int s : sizeOf) even = even && s == columns;
  }

  // The world rank of host h's local rank l.
  int worldRank(int h, int l) const { return rankAt_[static_cast<std::size_t>(h)][static_cast<std::size_t>(l)]; }
  // The local rank of host h that carries column c.
  int holder(int h, int c) const { return c % sizeOf[static_cast<std::size_t>(h)]; }

 private:
  std::vector<std::vector<int>> rankAt_;  // by host, by local rank
};

}  // namespace ferry
