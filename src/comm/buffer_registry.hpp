#pragma once
// The host side of Comm::registerBuffer: which address ranges of this rank are registered under
// which id (RegistrationRanges, no GPU needed), and the peers' mappings of every registration with
// the device table kernels read (BufferRegistry).
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "kernels/registration.hpp"
#include "ferry/communicator.hpp"
#include "ferry/port_channel.hpp"
#include "ferry/registered_memory.hpp"

namespace ferry {

class RegistrationRanges {
 public:
  struct Hit {
    std::uint64_t id = 0;  // 0: not registered
    std::uint64_t offset = 0;
  };
  // Error(InvalidUsage) naming `who` when [ptr, ptr + bytes) overlaps a registered range.
  void add(std::uint64_t id, const void* ptr, std::uint64_t bytes, const std::string& who);
  // The same check without adding.
  void check(const void* ptr, std::uint64_t bytes, const std::string& who) const;
  // false when no range has that id.
  bool remove(std::uint64_t id);
  // The registration that holds all of [ptr, ptr + bytes); id 0 when none does.
  Hit find(const void* ptr, std::uint64_t bytes) const;
  std::size_t size() const { return byStart_.size(); }

 private:
  struct Range {
    std::uint64_t end, id;
  };
  std::map<std::uint64_t, Range> byStart_;
};

class BufferRegistry {
 public:
  // @pre a current CUDA device; comm's ranks on this host. service: where every rank's buffer of a
  // registration is added as a memory (RegEntry::memory), so that port channels can name it; may be
  // null (then 0).
  BufferRegistry(Communicator& comm, PortChannelService* service);
  ~BufferRegistry();
  BufferRegistry(const BufferRegistry&) = delete;
  BufferRegistry& operator=(const BufferRegistry&) = delete;

  // Collective: every rank registers its buffer of the same role in the same order. Returns the id.
  std::uint64_t add(void* ptr, std::uint64_t bytes);
  // Local. Forgets the registration and drops the peers' mappings of it. Error(InvalidUsage) for an
  // unknown id. @pre no queued work uses it (the Comm waits for its own first: StreamWork).
  void remove(std::uint64_t id);
  // Error(InvalidUsage) unless `id` is live.
  void checkLive(std::uint64_t id) const;
  RegistrationRanges::Hit find(const void* ptr, std::uint64_t bytes) const { return ranges_.find(ptr, bytes); }
  const RegTable* table() const { return table_; }

 private:
  Communicator& comm_;
  RegTable* table_ = nullptr;  // device memory
  std::uint64_t nextId_ = 0;
  RegistrationRanges ranges_;
  PortChannelService* service_;
  struct Live {
    std::vector<RegisteredMemory> memories;  // every rank's: keeps the mappings
    std::vector<MemoryId> ids;               // in service_
  };
  std::map<std::uint64_t, Live> live_;
  void forget(const std::vector<MemoryId>& ids);
};

}  // namespace ferry
