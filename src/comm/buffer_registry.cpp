#include "comm/buffer_registry.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <future>

#include "platform/cuda_check.hpp"
#include "ferry/errors.hpp"
#include "core/text.hpp"
#include "platform/device_upload.hpp"

namespace ferry {
namespace {

constexpr int kTag = 0x7265;  // the Comm's own tag for registration exchanges

}  // namespace

void RegistrationRanges::add(std::uint64_t id, const void* ptr, std::uint64_t bytes, const std::string& who) {
  check(ptr, bytes, who);
  const auto start = reinterpret_cast<std::uint64_t>(ptr);
  byStart_.emplace(start, Range{start + bytes, id});
}

void RegistrationRanges::check(const void* ptr, std::uint64_t bytes, const std::string& who) const {
  const auto start = reinterpret_cast<std::uint64_t>(ptr), end = start + bytes;
  auto next = byStart_.lower_bound(start);
  auto overlapping = [&](std::map<std::uint64_t, Range>::const_iterator it) {
    return it != byStart_.end() && it->first < end && start < it->second.end;
  };
  const bool clash = overlapping(next) || (next != byStart_.begin() && overlapping(std::prev(next)));
  if (clash) {
    const auto it = overlapping(next) ? next : std::prev(next);
    throw Error(ErrorCode::InvalidUsage, who + ": [" + hexString(start) + ", " + hexString(end) + ") overlaps the buffer [" +
                                             hexString(it->first) + ", " + hexString(it->second.end) +
                                             ") registered already; deregister that one first");
  }
}

bool RegistrationRanges::remove(std::uint64_t id) {
  for (auto it = byStart_.begin(); it != byStart_.end(); ++it)
    if (it->second.id == id) {
      byStart_.erase(it);
      return true;
    }
  return false;
}

RegistrationRanges::Hit RegistrationRanges::find(const void* ptr, std::uint64_t bytes) const {
  const auto start = reinterpret_cast<std::uint64_t>(ptr);
  auto it = byStart_.upper_bound(start);
  if (ptr == nullptr || it == byStart_.begin()) return {};
  --it;
  if (start + bytes > it->second.end) return {};
  return {it->second.id, start - it->first};
}

BufferRegistry::BufferRegistry(Communicator& comm, PortChannelService* service) : comm_(comm), service_(service) {
  FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&table_), sizeof(RegTable)));
  zeroNow(table_, sizeof(RegTable));
}

BufferRegistry::~BufferRegistry() {
  live_.clear();
  (void)cudaFree(table_);
}

std::uint64_t BufferRegistry::add(void* ptr, std::uint64_t bytes) {
  const auto& boot = comm_.bootstrap();
  const int rank = boot->rank(), size = boot->size();
  const std::string who = "rank " + std::to_string(rank) + ": registerBuffer";
  // Every rank checks its own side first, then all agree, so that a refusal on one rank never
  // leaves the others waiting in the exchange or pairs this rank's next buffer with their current.
  // The id is the next one whose table slot is free on every rank (ranks may deregister at
  // different moments), so a long-lived registration never blocks the slots' reuse.
  struct Proposal {
    std::uint8_t ok;
    std::uint8_t busy[kRegSlots / 8];  // slots of this rank's live registrations
  };
  static_assert(sizeof(Proposal) == 1 + kRegSlots / 8);
  std::string refusal;
  if (ptr == nullptr || bytes == 0) {
    refusal = "the buffer is null or empty";
  } else {
    try {
      ranges_.check(ptr, bytes, who);
    } catch (const Error& e) {
      refusal = e.what();
    }
  }
  std::vector<Proposal> proposals(static_cast<std::size_t>(size));
  Proposal& mine = proposals[static_cast<std::size_t>(rank)];
  mine = {};
  mine.ok = refusal.empty() ? 1 : 0;
  for (const auto& [liveId, unused] : live_)
    mine.busy[liveId % kRegSlots / 8] |= static_cast<std::uint8_t>(1u << (liveId % 8));
  boot->allGather(proposals.data(), sizeof(Proposal));
  std::string refusedBy;
  std::uint8_t busy[kRegSlots / 8] = {};
  for (int p = 0; p < size; ++p) {
    if (!proposals[p].ok) refusedBy += (refusedBy.empty() ? "" : ", ") + std::to_string(p);
    for (int b = 0; b < kRegSlots / 8; ++b) busy[b] |= proposals[p].busy[b];
  }
  if (!refusedBy.empty())
    throw Error(ErrorCode::InvalidUsage, who + ": refused by rank(s) " + refusedBy + " (nothing was registered)" +
                                             (refusal.empty() ? "" : "; here: " + refusal));
  std::uint64_t id = nextId_ + 1;
  while (busy[id % kRegSlots / 8] >> (id % 8) & 1)
    if (++id > nextId_ + kRegSlots)
      throw Error(ErrorCode::InvalidUsage,
                  who + ": " + std::to_string(kRegSlots) +
                      " buffers are registered on some rank already (the most at once); "
                      "deregister older buffers on every rank");
  const int slot = static_cast<int>(id % kRegSlots);
  ranges_.add(id, ptr, bytes, who);  // checked above
  nextId_ = id;
  try {
    std::vector<RegisteredMemory> all(static_cast<std::size_t>(size));
    std::vector<MemoryId> ids;
    // Ethernet too, as PeerMemory's: for port channels over connections that copy.
    all[rank] = comm_.registerMemory(ptr, bytes, Transport::CudaIpc | Transport::Ethernet);
    std::vector<std::shared_future<RegisteredMemory>> futures(static_cast<std::size_t>(size));
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      comm_.sendMemory(all[rank], p, kTag);
      futures[p] = comm_.recvMemory(p, kTag);
    }
    RegEntry row[kMaxRanks] = {};
    for (int p = 0; p < size; ++p) {
      if (p != rank) all[p] = futures[p].get();
      if (all[p].data() == nullptr)
        throw Error(ErrorCode::NotSupported, who + ": rank " + std::to_string(p) +
                                                 "'s buffer cannot be mapped here (not device memory of a GPU "
                                                 "this process can reach?)");
    }
    try {
      for (int p = 0; p < size; ++p) {
        const MemoryId memory = service_ != nullptr ? ids.emplace_back(service_->addMemory(all[p])) : 0;
        row[p] = {reinterpret_cast<std::uint64_t>(all[p].data()), id, all[p].size(), memory};
      }
      uploadNow(&table_->entry[slot][0], row, sizeof(row));  // (the next call may be on any stream)
    } catch (...) {
      forget(ids);
      throw;
    }
    live_.emplace(id, Live{std::move(all), std::move(ids)});
  } catch (...) {
    ranges_.remove(id);
    throw;
  }
  return id;
}

void BufferRegistry::checkLive(std::uint64_t id) const {
  if (live_.find(id) == live_.end())
    throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(comm_.bootstrap()->rank()) +
                                             ": deregisterBuffer: no buffer is registered under id " +
                                             std::to_string(id));
}

void BufferRegistry::remove(std::uint64_t id) {
  checkLive(id);
  auto it = live_.find(id);
  RegEntry empty[kMaxRanks] = {};
  uploadNow(&table_->entry[id % kRegSlots][0], empty, sizeof(empty));
  ranges_.remove(id);
  forget(it->second.ids);
  live_.erase(it);
}

void BufferRegistry::forget(const std::vector<MemoryId>& ids) {
  for (MemoryId m : ids) service_->removeMemory(m);
}

}  // namespace ferry
