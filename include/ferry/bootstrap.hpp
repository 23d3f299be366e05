#pragma once
// The bootstrap is ferry's out-of-band control plane: ranks find each other, exchange the small
// descriptors that set up the data plane (registered memory, connections), and synchronize. It is
// never on the data path.
//
// Every operation is bounded (FERRY_BOOTSTRAP_TIMEOUT, default 120 s, or Options::timeout) and
// raises TimeoutError naming the ranks that did not arrive. All ranks must call the collective
// operations (allGather, barrier, split) in the same order.
//
// Example (one process per GPU, rank 0 shares the id out of band):
//   ferry::UniqueId id = rank == 0 ? ferry::UniqueId::create() : receiveIdSomehow();
//   auto boot = ferry::TcpBootstrap::create(id, rank, worldSize);
//   std::vector<int> ranks(worldSize);
//   ranks[rank] = rank;
//   boot->allGather(ranks.data(), sizeof(int));
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/api.hpp"

namespace ferry {

// The root's address and the job's random secret, in a fixed-size, trivially copyable blob that
// rank 0 makes and hands to the other ranks out of band (an MPI broadcast, a file, a store).
struct FERRY_API UniqueId {
  static constexpr std::size_t kBytes = 128;
  std::array<std::uint8_t, kBytes> bytes{};

  // Picks the interface (FERRY_SOCKET_IFNAME, else the first non-loopback one that is up) and
  // reserves a port for the root there: the reserved socket is adopted by the process's rank 0.
  static UniqueId create();
  // For a process that made the id but will not be its rank 0 (a launcher that spawns the ranks):
  // closes the port create() reserved, so that the process that is rank 0 can listen there.
  // Without a reservation, rank 0 binds the port at init; a no-op for an id made elsewhere.
  void releaseRootPort() const;
  // "host:port" of the root, for logs.
  std::string rootAddress() const;
  // Hex form, for passing through text channels (environment variables, files).
  std::string toHex() const;
  static UniqueId fromHex(const std::string& hex);
};

class FERRY_API Bootstrap {
 public:
  virtual ~Bootstrap();
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Ranks on this rank's host (same FERRY_HOSTID, or hostname and boot id), ascending.
  virtual const std::vector<int>& hostRanks() const = 0;
  int localRank() const;
  int localSize() const;
  bool sameHost(int peer) const;
  // Hosts are numbered in order of their lowest rank.
  virtual int node() const = 0;
  virtual int numNodes() const = 0;

  // Sends bytes to peer, matched by (sender, tag) at the receiver. Buffered: returns once the data
  // is copied, so a send never waits for the matching recv. Messages from one sender with one tag
  // arrive in order.
  virtual void send(const void* data, std::size_t bytes, int peer, int tag) = 0;
  // Receives exactly `bytes` from peer with tag; a message of another size is an InvalidUsage error.
  virtual void recv(void* data, std::size_t bytes, int peer, int tag) = 0;
  // Receives one message of any size.
  virtual std::vector<std::byte> recv(int peer, int tag) = 0;
  // allData holds size() slots of bytesPerRank; slot rank() is this rank's input, the others are
  // filled from the other ranks.
  virtual void allGather(void* allData, std::size_t bytesPerRank) = 0;
  virtual void barrier() = 0;
};

class FERRY_API TcpBootstrap : public Bootstrap {
 public:
  struct Options {
    // Bound on every operation; unset: FERRY_BOOTSTRAP_TIMEOUT.
    std::optional<std::chrono::duration<double>> timeout;
    // Time a new connection has to authenticate; unset: FERRY_BOOTSTRAP_HANDSHAKE_TIMEOUT.
    std::optional<std::chrono::duration<double>> handshakeTimeout;
  };

  // Joins the group described by id. Rank 0 is the root that the others connect to.
  static std::shared_ptr<TcpBootstrap> create(const UniqueId& id, int rank, int worldSize,
                                              const Options& options = {});
  // Joins through the root's "host:port" ("[v6addr]:port" for IPv6). Without a random secret in
  // hand, the join is authenticated by FERRY_BOOTSTRAP_SECRET (and TORCHELASTIC_RUN_ID) only.
  static std::shared_ptr<TcpBootstrap> create(const std::string& rootHostPort, int rank, int worldSize,
                                              const Options& options = {});
  // From torchrun's MASTER_ADDR, RANK and WORLD_SIZE; the port is FERRY_BOOTSTRAP_PORT, else
  // MASTER_PORT + 1 (torchrun's own store listens on MASTER_PORT).
  static std::shared_ptr<TcpBootstrap> fromEnvironment(const Options& options = {});

  ~TcpBootstrap() override;
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  int rank() const override;
  int size() const override;
  const std::vector<int>& hostRanks() const override;
  int node() const override;
  int numNodes() const override;
  void send(const void* data, std::size_t bytes, int peer, int tag) override;
  void recv(void* data, std::size_t bytes, int peer, int tag) override;
  std::vector<std::byte> recv(int peer, int tag) override;
  void allGather(void* allData, std::size_t bytesPerRank) override;
  void barrier() override;

  // Collective: ranks with the same color form a new group, ordered by (key, rank). A negative
  // color takes part in the call but joins no group and gets nullptr. The new group is independent
  // of this one (it may outlive it).
  std::shared_ptr<TcpBootstrap> split(int color, int key);

  // The address this rank listens on, "host:port".
  std::string listenAddress() const;

  struct Impl;

 private:
  explicit TcpBootstrap(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
