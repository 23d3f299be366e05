// Connection: the argument checks every transport shares, in one place.
#include "ferry/connection.hpp"

#include <cstdint>
#include <string>

#include "ferry/env.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

std::string range(std::uint64_t offset, std::uint64_t bytes) {
  return "[" + std::to_string(offset) + ", " + std::to_string(offset) + " + " + std::to_string(bytes) + ")";
}

}  // namespace

Connection::Connection(int rank, int remoteRank, Transport transport)
    : rank_(rank), remoteRank_(remoteRank), transport_(transport) {}

Connection::~Connection() = default;

std::string Connection::describe() const {
  return "rank " + std::to_string(rank_) + " -> rank " + std::to_string(remoteRank_) + " (" +
         std::string(toString(transport_)) + ")";
}

namespace {

// Who is speaking is described only when a check fails: the checks run on the proxy's hot path.
template <class Describe>
struct Checker {
  Describe who;
  const char* op;
  Transport transport;

  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCode::InvalidUsage, who() + ": " + op + ": " + why);
  }

  void remote(const RegisteredMemory& m, int remoteRank, const char* name, bool mapped) const {
    if (!m.valid()) fail(std::string(name) + " is an empty RegisteredMemory");
    // By rank, not by process: ranks that share a process (threads as ranks) see each other's
    // memory as local to the process, and that is fine.
    if (m.rank() != remoteRank)
      fail(std::string(name) + " must be memory of rank " + std::to_string(remoteRank) +
           " received from it (recvMemory), but it is rank " + std::to_string(m.rank()) + "'s");
    if (!mapped) {
      if (!m.transports().has(transport))
        fail(std::string(name) + " was registered for " + toString(m.transports()) + ", not for " +
             std::string(toString(transport)) + ": the owner must register it for this transport too");
      return;
    }
    if (m.data() == nullptr)
      fail(std::string(name) + " (registered for " + toString(m.transports()) +
           ") is not mapped in this process: it must be registered on the same host for CudaIpc (device "
           "memory) or HostMemory (hostAlloc memory)");
    if (transport == Transport::HostMemory && m.kind() != MemoryKind::Host)
      fail(std::string(name) + " is device memory; a HostMemory connection reaches host memory only");
  }

  void local(const RegisteredMemory& m, int rank, const char* name) const {
    if (!m.valid()) fail(std::string(name) + " is an empty RegisteredMemory");
    if (!m.isLocal() || m.rank() != rank)
      fail(std::string(name) + " must be memory this rank (" + std::to_string(rank) +
           ") registered, but it is rank " + std::to_string(m.rank()) + "'s");
    if (transport == Transport::HostMemory && m.kind() != MemoryKind::Host)
      fail(std::string(name) + " is device memory; a HostMemory connection copies from host memory only");
  }

  void inside(const RegisteredMemory& m, std::uint64_t offset, std::uint64_t bytes, const char* name) const {
    if (offset > m.size() || bytes > m.size() - offset)
      fail(std::string(name) + " range " + range(offset, bytes) + " is outside its " +
           std::to_string(m.size()) + "-byte registration (rank " + std::to_string(m.rank()) + ")");
  }
};

template <class D>
Checker(D, const char*, Transport) -> Checker<D>;

}  // namespace

void Connection::write(RegisteredMemory dst, std::uint64_t dstOffset, RegisteredMemory src,
                       std::uint64_t srcOffset, std::uint64_t bytes) {
  Checker check{[this] { return describe(); }, "write", transport_};
  check.remote(dst, remoteRank_, "dst", mapsPeerMemory());
  check.local(src, rank_, "src");
  check.inside(dst, dstOffset, bytes, "dst");
  check.inside(src, srcOffset, bytes, "src");
  if (bytes == 0) return;
  if (!mapsPeerMemory()) {
    doWriteTo(dst, dstOffset, static_cast<const char*>(src.data()) + srcOffset, bytes);
    return;
  }
  doWrite(static_cast<char*>(dst.data()) + dstOffset, static_cast<const char*>(src.data()) + srcOffset,
          bytes);
}

void Connection::write(RegisteredMemory dst, std::uint64_t dstOffset, const void* src, std::uint64_t bytes) {
  Checker check{[this] { return describe(); }, "write", transport_};
  if (!readsLocalPointers())
    check.fail("this transport copies from registered memory only; register the source (Communicator::registerMemory)");
  const bool own = dst.valid() && dst.rank() == rank_ && dst.isLocal();
  if (own)
    check.local(dst, rank_, "dst");
  else
    check.remote(dst, remoteRank_, "dst", mapsPeerMemory());
  check.inside(dst, dstOffset, bytes, "dst");
  if (bytes == 0) return;
  if (src == nullptr) check.fail("src is null");
  if (!own && !mapsPeerMemory()) {
    doWriteTo(dst, dstOffset, src, bytes);
    return;
  }
  doWrite(static_cast<char*>(dst.data()) + dstOffset, src, bytes);
}

void Connection::updateAndSync(RegisteredMemory dst, std::uint64_t dstOffset, std::uint64_t* src,
                               std::uint64_t newValue) {
  Checker check{[this] { return describe(); }, "updateAndSync", transport_};
  check.remote(dst, remoteRank_, "dst", mapsPeerMemory());
  check.inside(dst, dstOffset, sizeof(std::uint64_t), "dst");
  if (!mapsPeerMemory()) {
    if (dstOffset % alignof(std::uint64_t) != 0)
      check.fail("dst offset " + std::to_string(dstOffset) + " is not 8-byte aligned");
    if (src == nullptr) check.fail("src is null");
    if (reinterpret_cast<std::uintptr_t>(src) % alignof(std::uint64_t) != 0) check.fail("src is not 8-byte aligned");
    *src = newValue;
    doUpdateAndSyncTo(dst, dstOffset, newValue);
    return;
  }
  auto* word = static_cast<char*>(dst.data()) + dstOffset;
  if (reinterpret_cast<std::uintptr_t>(word) % alignof(std::uint64_t) != 0)
    check.fail("dst offset " + std::to_string(dstOffset) + " is not 8-byte aligned");
  if (src == nullptr) check.fail("src is null");
  if (reinterpret_cast<std::uintptr_t>(src) % alignof(std::uint64_t) != 0)
    check.fail("src is not 8-byte aligned");
  *src = newValue;
  doUpdateAndSync(reinterpret_cast<std::uint64_t*>(word), dst.kind() == MemoryKind::Host, newValue);
}

void Connection::flush(std::chrono::duration<double> timeout) {
  if (!(timeout.count() >= 0))
    throw Error(ErrorCode::InvalidUsage, describe() + ": flush: the timeout must be non-negative");
  doFlush(timeout);
}

void Connection::flush() { doFlush(env().connectionTimeout); }

std::uint64_t Connection::beginFlush() { return doBeginFlush(); }

void Connection::doWriteTo(const RegisteredMemory&, std::uint64_t, const void*, std::uint64_t) {
  throw Error(ErrorCode::InternalError, describe() + ": write: this transport maps the peer's memory");
}

void Connection::doUpdateAndSyncTo(const RegisteredMemory&, std::uint64_t, std::uint64_t) {
  throw Error(ErrorCode::InternalError, describe() + ": updateAndSync: this transport maps the peer's memory");
}

bool Connection::flushComplete(std::uint64_t ticket) { return doFlushComplete(ticket); }

}  // namespace ferry
