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
  // @pre a current CUDA device; comm's ranks on this host.
  explicit BufferRegistry(Communicator& comm);
  ~BufferRegistry();
  BufferRegistry(const BufferRegistry&) = delete;
  BufferRegistry& operator=(const BufferRegistry&) = delete;

  // Collective: every rank registers its buffer of the same role in the same order. Returns the id.
  std::uint64_t add(void* ptr, std::uint64_t bytes);
  // Local. Waits for this GPU's queued work, then forgets the registration and drops the peers'
  // mappings of it. Error(InvalidUsage) for an unknown id.
  void remove(std::uint64_t id);
  RegistrationRanges::Hit find(const void* ptr, std::uint64_t bytes) const { return ranges_.find(ptr, bytes); }
  const RegTable* table() const { return table_; }

 private:
  Communicator& comm_;
  RegTable* table_ = nullptr;  // device memory
  std::uint64_t nextId_ = 0;
  RegistrationRanges ranges_;
  std::map<std::uint64_t, std::vector<RegisteredMemory>> live_;  // id -> every rank's, keeps mappings
};

}  // namespace ferry
