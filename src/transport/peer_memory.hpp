#pragma once
// One device allocation per rank that every peer maps: made, registered and exchanged once, when a
// Comm is built (collective: every rank calls it with the same size and tag).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/communicator.hpp"
#include "ferry/registered_memory.hpp"

namespace ferry {

class PeerMemory {
 public:
  // `what` names the buffers in errors ("the collectives' buffers"); tag: a bootstrap tag no other
  // exchange of this Communicator uses. Throws Error(NotSupported) if a peer's allocation could
  // not be mapped here or differs in size (ranks configured differently).
  PeerMemory(Communicator& comm, std::uint64_t bytes, int tag, const std::string& what);

  char* local() const { return static_cast<char*>(memory_.get()); }
  // Rank p's allocation as mapped here; local() for this rank.
  char* peer(int p) const { return static_cast<char*>(peers_[static_cast<std::size_t>(p)].data()); }
  std::uint64_t bytes() const { return bytes_; }
  // Rank p's allocation as registered memory (this rank's own registration for p == rank).
  const RegisteredMemory& registration(int p) const { return peers_[static_cast<std::size_t>(p)]; }

 private:
  std::uint64_t bytes_;
  std::shared_ptr<void> memory_;
  std::vector<RegisteredMemory> peers_;  // keeps the mappings alive
};

}  // namespace ferry
