#pragma once
// Where the ranks of a Comm across hosts live (docs/multi-node.md, "A Comm across hosts"): each
// world rank's host (its partner index) and local rank, each host's ranks, and the columns of the
// cross-host phase. Every rank holds the same table (gathered when the Comm is made), so what it
// decides from it, every rank decides alike.
//
// Columns: a call's cross-host part is cut into `columns` parts (the most ranks any host has); on
// host h, local rank c % sizeOf[h] carries part c, so on hosts of equal size rank l carries part l
// alone, and on a smaller host a rank carries several (3 + 1 ranks: the lone rank carries all three).
#include <algorithm>
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
  int mostCarried = 1;       // the most columns one rank carries (on the smallest host)
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
    for (int s : sizeOf) mostCarried = std::max(mostCarried, (columns + s - 1) / s);
  }

  // The world rank of host h's local rank l.
  int worldRank(int h, int l) const { return rankAt_[static_cast<std::size_t>(h)][static_cast<std::size_t>(l)]; }
  // The local rank of host h that carries column c.
  int holder(int h, int c) const { return c % sizeOf[static_cast<std::size_t>(h)]; }
  // Host h's local ranks j * s .. j * s + s - 1 as world ranks, -1 past its last: the ones a host of
  // s ranks takes in one call of its own (round j), local rank l of that host taking the l-th.
  std::vector<int> round(int h, int j, int s) const {
    std::vector<int> ranks(static_cast<std::size_t>(s), -1);
    for (int l = 0; l < s; ++l)
      if (j * s + l < sizeOf[static_cast<std::size_t>(h)]) ranks[static_cast<std::size_t>(l)] = worldRank(h, j * s + l);
    return ranks;
  }
  // How many rounds of s ranks host h has.
  int rounds(int h, int s) const { return (sizeOf[static_cast<std::size_t>(h)] + s - 1) / s; }
  // The rounds of s ranks of the hosts before h: round j of host h is round roundsBefore(h, s) + j
  // of all hosts' together.
  int roundsBefore(int h, int s) const {
    int n = 0;
    for (int g = 0; g < h; ++g) n += rounds(g, s);
    return n;
  }
  // The most rounds of all hosts together that a host of any size here takes: what every rank sizes
  // a buffer of a chunk per round for (its own host may need fewer; every rank must ask alike).
  int mostRounds() const {
    int most = 0;
    for (int s : sizeOf) most = std::max(most, roundsBefore(hosts, s));
    return most;
  }
  // The same for a buffer of a round's s chunks per round.
  int mostRoundChunks() const {
    int most = 0;
    for (int s : sizeOf) most = std::max(most, roundsBefore(hosts, s) * s);
    return most;
  }

 private:
  std::vector<std::vector<int>> rankAt_;  // by host, by local rank
};

}  // namespace ferry
