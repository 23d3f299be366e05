// Communicator: registration, descriptor exchange and connection setup over a Bootstrap.
#include "ferry/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "core/serializer.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "transport/cuda_ipc_connection.hpp"
#include "transport/ethernet_connection.hpp"
#include "platform/cuda_runtime_util.hpp"
#include "transport/host_memory_connection.hpp"
#include "platform/process_identity.hpp"
#include "memory/registered_memory_impl.hpp"

namespace ferry {
namespace {

enum class Channel : int { Memory = 0, Connect = 1 };

int bootstrapTag(Channel channel, int tag) {
  return Communicator::kBootstrapTagBase + (static_cast<int>(channel) << 27) + tag;
}

// Receives the messages of each (peer, bootstrap tag) in order, whatever order futures are
// resolved in: the k-th future posted for a stream gets its k-th message.
class Mailbox {
 public:
  explicit Mailbox(std::shared_ptr<Bootstrap> boot) : boot_(std::move(boot)) {}

  std::uint64_t post(int peer, int btag) {
    std::lock_guard lock(mutex_);
    return streams_[{peer, btag}].posted++;
  }

  std::vector<std::byte> take(int peer, int btag, std::uint64_t seq) {
    std::lock_guard lock(mutex_);
    Stream& s = streams_[{peer, btag}];
    while (s.received <= seq) {
      s.arrived[s.received] = boot_->recv(peer, btag);
      ++s.received;
    }
    auto node = s.arrived.extract(seq);
    return std::move(node.mapped());
  }

 private:
  struct Stream {
    std::uint64_t posted = 0;
    std::uint64_t received = 0;
    std::map<std::uint64_t, std::vector<std::byte>> arrived;  // received, not yet taken
  };
  std::shared_ptr<Bootstrap> boot_;
  std::mutex mutex_;
  std::map<std::pair<int, int>, Stream> streams_;
};

// This rank's half of a connection handshake.
struct Hello {
  static constexpr std::uint32_t kMagic = 0x314e4346;  // "FCN1"
  Transport transport{};
  int rank = -1;
  std::uint64_t hostHash = 0;
  std::string hostName;
  int device = -1;
  // Ethernet: where this side listens for the peer, and the key the peer must prove it holds.
  bool hasEndpoint = false;
  SocketAddress address;
  wire::Nonce key{};
  std::uint8_t lanes = 1;  // the TCP streams this side offers (FERRY_ETHERNET_LANES)

  std::vector<std::byte> encode() const {
    Writer w;
    w.put(kMagic);
    w.put(static_cast<std::uint8_t>(transport));
    w.put(static_cast<std::int32_t>(rank));
    w.put(hostHash);
    w.putString(hostName);
    w.put(static_cast<std::int32_t>(device));
    w.put(static_cast<std::uint8_t>(hasEndpoint));
    if (hasEndpoint) {
      address.serialize(w);
      w.putBytes(std::as_bytes(std::span(key)));
      w.put(lanes);
    }
    return std::move(w).bytes();
  }
  static Hello decode(std::span<const std::byte> bytes) {
    Reader r(bytes, "connection handshake");
    Hello h;
    if (r.get<std::uint32_t>() != kMagic)
      throw Error(ErrorCode::ProtocolError,
                  "connection handshake has a bad magic (a stray message on the tag?)");
    auto t = r.get<std::uint8_t>();
    if (t >= kTransportCount)
      throw Error(ErrorCode::ProtocolError, "connection handshake names transport " + std::to_string(t));
    h.transport = static_cast<Transport>(t);
    h.rank = r.get<std::int32_t>();
    h.hostHash = r.get<std::uint64_t>();
    h.hostName = r.getString();
    h.device = r.get<std::int32_t>();
    h.hasEndpoint = r.get<std::uint8_t>() != 0;
    if (h.hasEndpoint) {
      h.address = SocketAddress::deserialize(r);
      const auto key = r.getBytes(h.key.size());
      std::memcpy(h.key.data(), key.data(), h.key.size());
      h.lanes = r.get<std::uint8_t>();
      if (h.lanes < 1 || h.lanes > EthernetConnection::kMaxLanes)
        throw Error(ErrorCode::ProtocolError, "connection handshake offers " + std::to_string(h.lanes) + " lanes");
    }
    r.expectEnd();
    return h;
  }
};

std::string hostName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

bool needsOneHost(Transport t) { return t == Transport::CudaIpc || t == Transport::HostMemory; }

std::shared_ptr<Connection> makeConnection(const Hello& mine, const Hello& theirs, int peer,
                                           std::shared_ptr<EthernetConnection::Endpoint> endpoint) {
  std::string pair = "rank " + std::to_string(mine.rank) + " -> rank " + std::to_string(peer) + " (" +
                     std::string(toString(mine.transport)) + ")";
  if (theirs.rank != peer)
    throw Error(ErrorCode::ProtocolError,
                pair + ": the handshake came from rank " + std::to_string(theirs.rank));
  if (theirs.transport != mine.transport)
    throw Error(ErrorCode::InvalidUsage,
                pair + ": rank " + std::to_string(peer) + " asked for " +
                    std::string(toString(theirs.transport)) +
                    " on the same tag: both ends must connect with the same transport");
  if (needsOneHost(mine.transport) && theirs.hostHash != mine.hostHash)
    throw Error(ErrorCode::InvalidUsage,
                pair + ": rank " + std::to_string(mine.rank) + " is on host '" + mine.hostName +
                    "' and rank " + std::to_string(peer) + " on host '" + theirs.hostName + "'" +
                    (mine.hostName == theirs.hostName ? " (different host ids)" : "") + "; " +
                    std::string(toString(mine.transport)) + " connects ranks of one host only");
  switch (mine.transport) {
    case Transport::CudaIpc:
      if (mine.device < 0) throw Error(ErrorCode::NotSupported, pair + ": this process has no CUDA device");
      return std::make_shared<CudaIpcConnection>(mine.rank, peer, mine.device);
    case Transport::HostMemory: return std::make_shared<HostMemoryConnection>(mine.rank, peer);
    case Transport::Ethernet:
      if (!theirs.hasEndpoint)
        throw Error(ErrorCode::ProtocolError, pair + ": rank " + std::to_string(peer) + "'s hello has no address");
      return EthernetConnection::establish(mine.rank, peer, std::move(*endpoint), theirs.address, theirs.key,
                                           std::min(mine.lanes, theirs.lanes), env().connectionTimeout);
    case Transport::InfiniBand: break;
  }
  throw Error(ErrorCode::NotSupported, pair + ": this transport is not implemented yet");
}

}  // namespace

struct Communicator::Impl {
  std::shared_ptr<Bootstrap> boot;
  std::shared_ptr<Mailbox> mailbox;

  void checkPeer(int peer, int tag, const char* op) const {
    int rank = boot->rank();
    if (peer < 0 || peer >= boot->size())
      throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(rank) + ": " + op + ": peer " +
                                               std::to_string(peer) + " is not a rank of this group of " +
                                               std::to_string(boot->size()));
    if (peer == rank)
      throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(rank) + ": " + op +
                                               " with itself (peer " + std::to_string(peer) +
                                               ") is not supported");
    if (tag < 0 || tag > kMaxTag)
      throw Error(ErrorCode::InvalidUsage, "rank " + std::to_string(rank) + ": " + op + ": tag " +
                                               std::to_string(tag) + " is outside [0, " +
                                               std::to_string(kMaxTag) + "]");
  }
};

Communicator::Communicator(std::shared_ptr<Bootstrap> bootstrap) : impl_(std::make_unique<Impl>()) {
  if (!bootstrap) throw Error(ErrorCode::InvalidUsage, "Communicator: the bootstrap is null");
  impl_->boot = std::move(bootstrap);
  impl_->mailbox = std::make_shared<Mailbox>(impl_->boot);
}

Communicator::~Communicator() = default;

const std::shared_ptr<Bootstrap>& Communicator::bootstrap() const noexcept { return impl_->boot; }

RegisteredMemory Communicator::registerMemory(void* ptr, std::size_t size, TransportFlags transports) {
  std::string who = "rank " + std::to_string(impl_->boot->rank()) + ": registerMemory";
  if (ptr == nullptr) throw Error(ErrorCode::InvalidUsage, who + ": the pointer is null");
  if (size == 0) throw Error(ErrorCode::InvalidUsage, who + ": the size is 0");
  if (transports.empty()) throw Error(ErrorCode::InvalidUsage, who + ": no transport given");
  return RegisteredMemory(registerLocal(ptr, size, transports, impl_->boot->rank()));
}

void Communicator::sendMemory(const RegisteredMemory& memory, int peer, int tag) {
  impl_->checkPeer(peer, tag, "sendMemory");
  if (!memory.valid())
    throw Error(ErrorCode::InvalidUsage,
                "rank " + std::to_string(impl_->boot->rank()) + ": sendMemory of an empty RegisteredMemory");
  std::vector<std::byte> bytes = memory.serialize();
  impl_->boot->send(bytes.data(), bytes.size(), peer, bootstrapTag(Channel::Memory, tag));
}

std::shared_future<RegisteredMemory> Communicator::recvMemory(int peer, int tag) {
  impl_->checkPeer(peer, tag, "recvMemory");
  int btag = bootstrapTag(Channel::Memory, tag);
  std::uint64_t seq = impl_->mailbox->post(peer, btag);
  return std::async(std::launch::deferred,
                    [mailbox = impl_->mailbox, peer, btag, seq] {
                      std::vector<std::byte> bytes = mailbox->take(peer, btag, seq);
                      return RegisteredMemory::deserialize(bytes);
                    })
      .share();
}

std::shared_future<std::shared_ptr<Connection>> Communicator::connect(int peer, Transport transport,
                                                                      int tag) {
  impl_->checkPeer(peer, tag, "connect");
  if (static_cast<int>(transport) >= kTransportCount)
    throw Error(ErrorCode::InvalidUsage,
                "connect: transport " + std::to_string(static_cast<int>(transport)) + " does not exist");
  Hello mine;
  mine.transport = transport;
  mine.rank = impl_->boot->rank();
  mine.hostHash = processIdentity().hostHash;
  mine.hostName = hostName();
  // The device current now; a failure to find one surfaces from get(), after the peer has been
  // answered, so that it does not wait out its timeout.
  mine.device = transport == Transport::CudaIpc && gpuPresent() ? currentDevice() : -1;
  std::shared_ptr<EthernetConnection::Endpoint> endpoint;
  if (transport == Transport::Ethernet) {
    endpoint = std::make_shared<EthernetConnection::Endpoint>(EthernetConnection::Endpoint::open());
    mine.hasEndpoint = true;
    mine.address = endpoint->address;
    mine.key = endpoint->key;
    mine.lanes = static_cast<std::uint8_t>(
        std::clamp<std::int64_t>(env().ethernetLanes, 1, EthernetConnection::kMaxLanes));
  }
  int btag = bootstrapTag(Channel::Connect, tag);
  std::vector<std::byte> hello = mine.encode();
  impl_->boot->send(hello.data(), hello.size(), peer, btag);
  std::uint64_t seq = impl_->mailbox->post(peer, btag);
  // An Ethernet connection is set up by both sides at once (each connects to the other's listener
  // and accepts on its own), so it runs now, on a thread of its own: were it deferred to get(), ranks
  // that get() their peers' connections in different orders would wait for each other.
  const auto policy = transport == Transport::Ethernet ? std::launch::async : std::launch::deferred;
  return std::async(policy,
                    [mailbox = impl_->mailbox, mine, peer, btag, seq, endpoint] {
                      Hello theirs = Hello::decode(mailbox->take(peer, btag, seq));
                      return makeConnection(mine, theirs, peer, endpoint);
                    })
      .share();
}

}  // namespace ferry
