#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <sstream>

#include "core/bootstrap_env.hpp"
#include "core/bootstrap_network.hpp"
#include "core/handshake.hpp"
#include "core/host_id.hpp"
#include "core/interfaces.hpp"
#include "core/logger.hpp"
#include "core/serializer.hpp"
#include "core/unique_id.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/env.hpp"
#include "core/text.hpp"
#include "ferry/errors.hpp"
#include "core/deadline.hpp"

namespace ferry {

using Seconds = std::chrono::duration<double>;

namespace {

std::string rankList(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8 && ranks.size() > 10) {
      out << " and " << ranks.size() - i << " more";
      break;
    }
    out << (i ? ", " : "") << ranks[i];
  }
  return out.str();
}

std::string seconds(Seconds s) {
  std::ostringstream out;
  out << s.count() << " s";
  return out.str();
}

Clock::time_point after(Seconds s) { return deadlineAfter(s); }

void checkRank(int rank, int worldSize, const char* call) {
  if (worldSize < 1 || worldSize > wire::kMaxWorldSize)
    throw Error(ErrorCode::InvalidUsage, std::string(call) + ": world size " + std::to_string(worldSize) +
                                             " is out of range (1.." + std::to_string(wire::kMaxWorldSize) +
                                             ")");
  if (rank < 0 || rank >= worldSize)
    throw Error(ErrorCode::InvalidUsage, std::string(call) + ": rank " + std::to_string(rank) +
                                             " is out of range for world size " + std::to_string(worldSize));
}

// One rank's contribution to split(): fixed size, so it travels through allGather.
struct SplitRecord {
  std::int32_t color = -1;
  std::int32_t key = 0;
  SocketAddress listen;
  std::uint64_t hostHash = 0;
  wire::Secret nonce{};
  static constexpr std::size_t kBytes = 4 + 4 + SocketAddress::kWireBytes + 8 + 16;

  void write(std::byte* out) const {
    Writer w;
    w.put(color);
    w.put(key);
    listen.serialize(w);
    w.put(hostHash);
    w.put(nonce);
    std::memcpy(out, w.bytes().data(), kBytes);
  }
  static SplitRecord read(const std::byte* in) {
    Reader r(std::span(in, kBytes), "split record");
    SplitRecord s;
    s.color = r.get<std::int32_t>();
    s.key = r.get<std::int32_t>();
    s.listen = SocketAddress::deserialize(r);
    s.hostHash = r.get<std::uint64_t>();
    s.nonce = r.get<wire::Secret>();
    return s;
  }
};

}  // namespace

struct TcpBootstrap::Impl {
  int rank = 0;
  int worldSize = 1;
  Seconds timeout{120.0};
  wire::Secret secret{};
  std::uint64_t hostHash = 0;
  std::vector<wire::PeerEntry> table;
  std::vector<int> hostRanks;
  int node = 0;
  int numNodes = 1;
  std::unique_ptr<BootstrapNetwork> net;
  std::atomic<std::int64_t> collectiveSeq{0};

  Seconds handshakeTimeout{10.0};

  Impl(int rank, int worldSize, const TcpBootstrap::Options& o, const wire::Secret& secret)
      : rank(rank),
        worldSize(worldSize),
        timeout(o.timeout.value_or(env().bootstrapTimeout)),
        secret(secret),
        hostHash(ferry::hostHash()),
        handshakeTimeout(std::min(o.handshakeTimeout.value_or(env().handshakeTimeout), timeout)) {}

  void startNetwork(Socket listener, bool acceptJoins) {
    BootstrapNetwork::Config c;
    c.rank = rank;
    c.worldSize = worldSize;
    c.secret = secret;
    c.hostHash = hostHash;
    c.handshakeTimeout = handshakeTimeout;
    c.flushTimeout = timeout;
    c.maxMessage = env().bootstrapMaxMessage;
    c.acceptJoins = acceptJoins;
    net = std::make_unique<BootstrapNetwork>(c, std::move(listener));
  }

  void setTable(std::vector<wire::PeerEntry> entries) {
    table = std::move(entries);
    std::vector<SocketAddress> addresses;
    std::vector<std::uint64_t> hosts;  // in order of each host's lowest rank
    for (int r = 0; r < worldSize; ++r) {
      addresses.push_back(table[r].listen);
      if (table[r].hostHash == table[rank].hostHash) hostRanks.push_back(r);
      if (std::find(hosts.begin(), hosts.end(), table[r].hostHash) == hosts.end())
        hosts.push_back(table[r].hostHash);
    }
    node = static_cast<int>(std::find(hosts.begin(), hosts.end(), table[rank].hostHash) - hosts.begin());
    numNodes = static_cast<int>(hosts.size());
    net->setPeerAddresses(std::move(addresses));
  }

  void joinAsRoot(Socket listener, Clock::time_point deadline) {
    startNetwork(std::move(listener), /*acceptJoins=*/true);
    auto joins = net->waitForJoins(worldSize - 1, deadline);
    net->stopAcceptingJoins();
    if (static_cast<int>(joins.size()) < worldSize - 1) {
      std::vector<int> missing;
      for (int r = 1; r < worldSize; ++r)
        if (!joins.count(r)) missing.push_back(r);
      std::string reason = "ranks " + rankList(missing) + " never joined within " + seconds(timeout) + " (" +
                           std::to_string(worldSize - static_cast<int>(missing.size())) + " of " +
                           std::to_string(worldSize) + " present)";
      auto notice = std::make_shared<const Payload>(
          wire::encodeAbort({reason, std::vector<std::int32_t>(missing.begin(), missing.end())}));
      for (const auto& [r, hello] : joins) {
        try {
          net->send(r, wire::FrameKind::Abort, 0, notice, after(Seconds(1.0)), "bootstrap init abort");
        } catch (const Error&) {  // that rank is gone too; the others still hear why
        }
      }
      net->flush(after(Seconds(2.0)));
      throw TimeoutError("rank 0: bootstrap init failed: " + reason +
                         "; check that every rank started and uses the same root address and world size");
    }
    std::vector<wire::PeerEntry> entries(static_cast<std::size_t>(worldSize));
    entries[0] = {net->listenAddress(), hostHash};
    for (const auto& [r, hello] : joins) entries[r] = {hello.listen, hello.hostHash};
    auto encoded = std::make_shared<const Payload>(wire::encodeTable(entries));
    for (int r = 1; r < worldSize; ++r)
      net->send(r, wire::FrameKind::Table, 0, encoded, deadline, "bootstrap init");
    setTable(std::move(entries));
  }

  void joinAsMember(const SocketAddress& root, Clock::time_point deadline) {
    startNetwork(Socket::listen(chooseLocalAddress(root), /*reuseAddr=*/false), /*acceptJoins=*/false);
    Socket link = connectToRoot(root, deadline);
    wire::Hello hello;
    hello.kind = wire::HelloKind::Join;
    hello.rank = rank;
    hello.worldSize = worldSize;
    hello.target = 0;
    hello.listen = net->listenAddress();
    hello.hostHash = hostHash;
    handshake::Session session = handshake::connectHandshake(
        link, hello, secret, std::min(deadline, deadlineAfter(handshakeTimeout)), rankName(rank) + ": bootstrap init");
    net->adopt(0, std::move(link), session);
    // The root aborts at its own deadline, naming the ranks that never came; wait a little past ours
    // so that its notice, not a bare timeout, is what this rank reports.
    auto grace = std::min(Seconds(5.0), timeout / 2);
    std::optional<BootstrapNetwork::Message> reply;
    try {
      reply = net->receive(0, {wire::FrameKind::Table, wire::FrameKind::Abort}, 0,
                           deadlineAfter(grace, deadline), "bootstrap init");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::RemoteError) throw;
      throw Error(ErrorCode::RemoteError,
                  rankName(rank) + ": bootstrap init: the root (rank 0) at " + root.toString() +
                      " closed the connection: it rejected this rank's join or exited (its "
                      "log says why: wrong secret, duplicate rank, world size mismatch)");
    }
    if (!reply)
      throw TimeoutError(rankName(rank) + ": bootstrap init: the root (rank 0) at " + root.toString() +
                         " accepted this rank but sent no peer table within " + seconds(timeout) +
                         " (other ranks may be missing)");
    if (reply->kind == wire::FrameKind::Abort) {
      auto notice = wire::decodeAbort(reply->data, worldSize);
      throw TimeoutError(rankName(rank) + ": bootstrap init failed: the root reports that " + notice.reason);
    }
    setTable(wire::decodeTable(reply->data, worldSize));
  }

  Socket connectToRoot(const SocketAddress& root, Clock::time_point deadline) {
    auto pause = std::chrono::milliseconds(10);
    std::string lastError;
    while (Clock::now() < deadline) {
      try {
        return Socket::connect(root, std::min(deadline, Clock::now() + std::chrono::seconds(5)));
      } catch (const Error& e) {  // not up yet: ECONNREFUSED, or a timeout while it starts
        lastError = e.detail();
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(200));
    }
    throw TimeoutError(rankName(rank) + ": could not reach the root (rank 0) at " + root.toString() +
                       " within " + seconds(timeout) + " (last error: " + lastError +
                       "); is rank 0 running, and is that address reachable from this host?");
  }

  void logReady(Clock::time_point start) const {
    FERRY_LOG(Info, Bootstrap)
        << rankName(rank) << " of " << worldSize << ": bootstrap ready in "
        << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()
        << " ms, listening on " << net->listenAddress().toString() << ", " << hostRanks.size()
        << " ranks on this host (node " << node << " of " << numNodes << ")";
  }

  void checkPeer(int peer, const char* call) const {
    if (peer < 0 || peer >= worldSize || peer == rank)
      throw Error(ErrorCode::InvalidUsage, rankName(rank) + ": " + call + ": peer " + std::to_string(peer) +
                                               " is not another rank of this group (world size " +
                                               std::to_string(worldSize) + ")");
  }

  std::vector<int> others() const {
    std::vector<int> out;
    for (int i = 1; i < worldSize; ++i) out.push_back((rank + worldSize - i) % worldSize);
    return out;
  }

  // allGather and barrier: every rank sends its slot to every other rank directly, so a timeout
  // knows exactly whose contribution is missing.
  void exchange(wire::FrameKind kind, std::byte* all, std::size_t bytesPerRank, const std::string& name) {
    const std::int64_t seq = ++collectiveSeq;
    const std::string what = name + " #" + std::to_string(seq);
    const auto deadline = after(timeout);
    auto mine = std::make_shared<const Payload>(all + rank * bytesPerRank, all + (rank + 1) * bytesPerRank);
    // Every peer gets this rank's part even when sending to one fails (a peer gone, or unreachable
    // within the handshake bound): the others must not wait for it and then blame this rank. The
    // first failure is this call's error, once the rest is sent.
    std::exception_ptr sendFailure;
    for (int i = 1; i < worldSize; ++i) {
      try {
        net->send((rank + i) % worldSize, kind, seq, mine, deadline, what);
      } catch (const Error&) {
        if (!sendFailure) sendFailure = std::current_exception();
      }
    }
    if (sendFailure) {
      (void)net->flush(deadline);
      std::rethrow_exception(sendFailure);
    }
    auto missing = net->receiveFromEach(kind, seq, others(), deadline, what, [&](int peer, Payload&& data) {
      if (data.size() != bytesPerRank)
        throw Error(ErrorCode::InvalidUsage, rankName(rank) + ": " + what + ": " + rankName(peer) +
                                                 " contributed " + std::to_string(data.size()) +
                                                 " bytes, this rank " + std::to_string(bytesPerRank) +
                                                 " (every rank must pass the same size)");
      if (bytesPerRank) std::memcpy(all + peer * bytesPerRank, data.data(), bytesPerRank);
    });
    if (!missing.empty()) {
      std::sort(missing.begin(), missing.end());
      throw TimeoutError(rankName(rank) + ": " + what + " timed out after " + seconds(timeout) +
                         ": nothing arrived from ranks " + rankList(missing) + " (" +
                         std::to_string(worldSize - static_cast<int>(missing.size())) + " of " +
                         std::to_string(worldSize) + " arrived); they exited, hung, or have not called " +
                         name);
    }
    // Everything arrived; make sure this rank's own part has left too, so that a rank that exits
    // right after a barrier (without destroying its bootstrap) does not strand its peers in it.
    (void)net->flush(deadline);
  }
};

// ---- creation ----

TcpBootstrap::TcpBootstrap(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpBootstrap::~TcpBootstrap() = default;

std::shared_ptr<TcpBootstrap> TcpBootstrap::create(const UniqueId& id, int rank, int worldSize,
                                                   const Options& options) {
  checkRank(rank, worldSize, "TcpBootstrap::create");
  auto start = Clock::now();
  UniqueIdContents contents = decodeUniqueId(id);
  auto impl = std::make_unique<Impl>(rank, worldSize, options, contents.secret);
  auto deadline = deadlineAfter(impl->timeout, start);
  if (rank == 0) {
    auto reserved = takeReservedRootListener(contents.secret);
    impl->joinAsRoot(reserved ? std::move(*reserved) : Socket::listen(contents.root, /*reuseAddr=*/true),
                     deadline);
  } else {
    dropReservedRootListener(contents.secret);
    impl->joinAsMember(contents.root, deadline);
  }
  impl->logReady(start);
  return std::shared_ptr<TcpBootstrap>(new TcpBootstrap(std::move(impl)));
}

std::shared_ptr<TcpBootstrap> TcpBootstrap::create(const std::string& rootHostPort, int rank, int worldSize,
                                                   const Options& options) {
  checkRank(rank, worldSize, "TcpBootstrap::create");
  auto start = Clock::now();
  SocketAddress root = SocketAddress::parse(rootHostPort);
  const Env& e = env();
  if (e.bootstrapSecret.empty()) {
    // Once per process: the derived secret is only as secret as the root address.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      FERRY_LOG(Warn, Bootstrap) << "rank " << rank << ": joining " << rootHostPort
                                 << " by host:port without FERRY_BOOTSTRAP_SECRET: the join secret is derived from "
                                    "that address, so anyone who can reach the port can join; set "
                                    "FERRY_BOOTSTRAP_SECRET to the same random value on every rank (docs/security.md)";
  }
  auto secret =
      derivedSecret("ferry-host-port|" + e.bootstrapSecret + "|" + e.torchelasticRunId + "|" + rootHostPort);
  auto impl = std::make_unique<Impl>(rank, worldSize, options, secret);
  auto deadline = deadlineAfter(impl->timeout, start);
  if (rank == 0) {
    Socket listener;
    try {
      listener = Socket::listen(root, /*reuseAddr=*/true);
    } catch (const SysError& err) {
      throw Error(ErrorCode::InvalidUsage, "rank 0: cannot listen on the root address " + rootHostPort +
                                               ": " + err.detail() +
                                               " (another job on this port, or not this host's address?)");
    }
    impl->joinAsRoot(std::move(listener), deadline);
  } else {
    impl->joinAsMember(root, deadline);
  }
  impl->logReady(start);
  return std::shared_ptr<TcpBootstrap>(new TcpBootstrap(std::move(impl)));
}

std::shared_ptr<TcpBootstrap> TcpBootstrap::fromEnvironment(const Options& options) {
  return createFromEnv(env(), options);
}

std::shared_ptr<TcpBootstrap> createFromEnv(const Env& e, const TcpBootstrap::Options& options) {
  std::string missing;
  if (e.masterAddr.empty()) missing += " MASTER_ADDR";
  if (e.rank < 0) missing += " RANK";
  if (e.worldSize < 0) missing += " WORLD_SIZE";
  if (e.bootstrapPort < 0 && e.masterPort < 0) missing += " MASTER_PORT (or FERRY_BOOTSTRAP_PORT)";
  if (!missing.empty())
    throw Error(ErrorCode::InvalidUsage,
                "TcpBootstrap::fromEnvironment needs the torchrun variables; not set:" + missing);
  std::int64_t port = e.bootstrapPort >= 0 ? e.bootstrapPort : e.masterPort + 1;
  std::string host = e.masterAddr.find(':') != std::string::npos ? "[" + e.masterAddr + "]" : e.masterAddr;
  auto boot = TcpBootstrap::create(host + ":" + std::to_string(port), static_cast<int>(e.rank),
                                   static_cast<int>(e.worldSize), options);
  if (e.localRank >= 0 && e.localRank != boot->localRank())
    FERRY_LOG(Warn, Bootstrap) << "rank " << e.rank << ": LOCAL_RANK is " << e.localRank
                               << " but the bootstrap finds " << boot->localRank()
                               << " (set FERRY_HOSTID if hosts are misidentified)";
  return boot;
}

// ---- operations ----

int TcpBootstrap::rank() const { return impl_->rank; }
int TcpBootstrap::size() const { return impl_->worldSize; }
const std::vector<int>& TcpBootstrap::hostRanks() const { return impl_->hostRanks; }
int TcpBootstrap::node() const { return impl_->node; }
int TcpBootstrap::numNodes() const { return impl_->numNodes; }
std::string TcpBootstrap::listenAddress() const { return impl_->net->listenAddress().toString(); }

void TcpBootstrap::send(const void* data, std::size_t bytes, int peer, int tag) {
  impl_->checkPeer(peer, "send");
  if (data == nullptr && bytes > 0)
    throw Error(ErrorCode::InvalidUsage,
                rankName(impl_->rank) + ": send: data is null but bytes is " + std::to_string(bytes));
  auto first = static_cast<const std::byte*>(data);
  auto payload = std::make_shared<const Payload>(first, first + bytes);
  impl_->net->send(peer, wire::FrameKind::User, tag, std::move(payload), after(impl_->timeout),
                   "send(tag " + std::to_string(tag) + ") to " + rankName(peer));
}

std::vector<std::byte> TcpBootstrap::recv(int peer, int tag) {
  impl_->checkPeer(peer, "recv");
  std::string what = "recv(tag " + std::to_string(tag) + ") from " + rankName(peer);
  auto m = impl_->net->receive(peer, {wire::FrameKind::User}, tag, after(impl_->timeout), what);
  if (!m)
    throw TimeoutError(rankName(impl_->rank) + ": " + what + " timed out after " + seconds(impl_->timeout) +
                       ": nothing arrived (has " + rankName(peer) + " called send with this tag?)");
  return std::move(m->data);
}

void TcpBootstrap::recv(void* data, std::size_t bytes, int peer, int tag) {
  if (data == nullptr && bytes > 0)
    throw Error(ErrorCode::InvalidUsage,
                rankName(impl_->rank) + ": recv: data is null but bytes is " + std::to_string(bytes));
  auto message = recv(peer, tag);
  if (message.size() != bytes)
    throw Error(ErrorCode::InvalidUsage,
                rankName(impl_->rank) + ": recv(tag " + std::to_string(tag) + ") from " + rankName(peer) +
                    " expected " + std::to_string(bytes) + " bytes, got " + std::to_string(message.size()));
  if (bytes) std::memcpy(data, message.data(), bytes);
}

void TcpBootstrap::allGather(void* allData, std::size_t bytesPerRank) {
  if (allData == nullptr && bytesPerRank > 0)
    throw Error(ErrorCode::InvalidUsage, rankName(impl_->rank) + ": allGather: allData is null");
  impl_->exchange(wire::FrameKind::AllGather, static_cast<std::byte*>(allData), bytesPerRank, "allGather");
}

void TcpBootstrap::barrier() { impl_->exchange(wire::FrameKind::Barrier, nullptr, 0, "barrier"); }

std::shared_ptr<TcpBootstrap> TcpBootstrap::split(int color, int key) {
  const Impl& me = *impl_;
  SplitRecord mine;
  mine.color = color < 0 ? -1 : color;
  mine.key = key;
  mine.hostHash = me.hostHash;
  mine.nonce = randomSecret();
  Socket listener;
  if (color >= 0) {
    // Listen before the exchange: peers may connect as soon as they know the address.
    SocketAddress local = me.net->listenAddress();
    local.setPort(0);
    listener = Socket::listen(local, /*reuseAddr=*/false);
    mine.listen = listener.localAddress();
  }
  std::vector<std::byte> all(SplitRecord::kBytes * static_cast<std::size_t>(me.worldSize));
  mine.write(all.data() + SplitRecord::kBytes * static_cast<std::size_t>(me.rank));
  impl_->exchange(wire::FrameKind::AllGather, all.data(), SplitRecord::kBytes, "split");
  if (color < 0) return nullptr;

  std::vector<std::pair<SplitRecord, int>> members;
  for (int r = 0; r < me.worldSize; ++r) {
    auto rec = SplitRecord::read(all.data() + SplitRecord::kBytes * static_cast<std::size_t>(r));
    if (rec.color == mine.color) members.emplace_back(rec, r);
  }
  std::sort(members.begin(), members.end(), [](const auto& a, const auto& b) {
    return std::tie(a.first.key, a.second) < std::tie(b.first.key, b.second);
  });
  int childRank = static_cast<int>(
      std::find_if(members.begin(), members.end(), [&](const auto& m) { return m.second == me.rank; }) -
      members.begin());
  int childSize = static_cast<int>(members.size());
  TcpBootstrap::Options options;
  options.timeout = me.timeout;
  options.handshakeTimeout = me.handshakeTimeout;
  auto child = std::make_unique<Impl>(childRank, childSize, options, members.front().first.nonce);
  child->startNetwork(std::move(listener), /*acceptJoins=*/false);
  std::vector<wire::PeerEntry> entries;
  for (const auto& [rec, parentRank] : members) entries.push_back({rec.listen, rec.hostHash});
  child->setTable(std::move(entries));
  FERRY_LOG(Debug, Bootstrap) << rankName(me.rank) << ": split color " << color << " -> rank " << childRank
                              << " of " << childSize;
  return std::shared_ptr<TcpBootstrap>(new TcpBootstrap(std::move(child)));
}

// ---- Bootstrap helpers ----

Bootstrap::~Bootstrap() = default;

int Bootstrap::localRank() const {
  const auto& ranks = hostRanks();
  return static_cast<int>(std::find(ranks.begin(), ranks.end(), rank()) - ranks.begin());
}
int Bootstrap::localSize() const { return static_cast<int>(hostRanks().size()); }
bool Bootstrap::sameHost(int peer) const {
  const auto& ranks = hostRanks();
  return std::find(ranks.begin(), ranks.end(), peer) != ranks.end();
}

}  // namespace ferry
