#pragma once
// Comm: the collectives of one group of ranks, one process per GPU, with NCCL's calling
// conventions. Every call is asynchronous on the caller's stream, capturable in a CUDA graph, and
// allocates nothing and waits for nothing on the host: the buffers peers write into (scratch and
// LL packet space) are set up once, when the Comm is made.
//
//   cudaSetDevice(localRank);
//   auto boot = ferry::TcpBootstrap::create(id, rank, worldSize);
//   ferry::Comm comm(boot);                                     // collective: every rank calls it
//   comm.allReduce(send, recv, count, ferry::DataType::BFloat16, ferry::ReduceOp::Sum, stream);
//
// Rules, as with NCCL:
// - Every rank issues the same collectives, with the same counts, types, ops and roots, in the
//   same order. Calls of one Comm run in the order they were issued only if they share a stream
//   (or the caller orders the streams); give concurrent work its own Comm.
// - Buffers are device memory of the Comm's GPU. send == recv is in-place; other overlap is an
//   error. Pointers must be aligned to the element size.
// - Errors: a bad argument is Error(InvalidUsage) naming the rank, the call and the argument, thrown
//   before anything is queued. A peer that never joins the call makes the kernel report the rank,
//   the peer and the call and stop after FERRY_DEVICE_TIMEOUT; the stream then returns an error.
//   A watchdog that cannot wait that long calls abort() (on any rank) to end every rank's kernels.
//
// Point-to-point send and recv run through a per-peer inbox (no registration needed), alone or
// grouped between groupStart() and groupEnd().
//
// Algorithms: several per collective, held in the Comm's own registry (ferry/algorithm.hpp), which
// the program may extend at run time with plans and native algorithms (addPlan, addAlgorithm); a
// selector picks one by collective, size, type and world size from built-in defaults, a tuning
// table (FERRY_TUNING_FILE, written by `ferry-bench --tune`), FERRY_ALGO, or setAlgorithm(), and
// remembers its choice per call shape.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/algorithm.hpp"
#include "ferry/api.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/collective.hpp"
#include "ferry/datatype.hpp"

namespace ferry {

class Communicator;
class Connection;

// How a Comm runs its kernels. Like NCCL's minCTAs / maxCTAs: every collective kernel runs at most
// maxBlocks thread blocks, e.g. to leave SMs to compute that overlaps communication, and at least
// minBlocks where its algorithm splits work over blocks (the copy-engine kernels drive the copies
// from one block) (0: ferry's own choice, at most 128). The Comm uses the tightest bounds any rank
// asked for (the ranks' kernels pair up block by block). Algorithms that need more blocks than
// maxBlocks (the copy-engine reductions need 17, a plan one per thread block) are not chosen;
// forcing one is an error. A group of sends and recvs (one kernel) shares this rank's maxBlocks
// among its peers and directions, at least one block each.
struct CommOptions {
  int minBlocks = 0;
  int maxBlocks = 0;
  // How this rank reaches `peer` through the proxy: the Connection under the Comm's PortChannel to
  // that peer, which carries the copy-engine algorithms (*_ce) and the port channels of plans.
  // Called while the Comm is made, for every peer in rank order, on every rank; the two ends of a
  // pair must make matching connections (Communicator::connect does). Empty:
  // communicator.connect(peer, Transport::CudaIpc). A connection of any kind works, built-in or the
  // program's own (a class derived from Connection): the collectives never ask which it is. (Its
  // transport() must be one the PortChannel semaphore supports: CudaIpc, HostMemory or Ethernet;
  // and the Comm's buffers are GPU memory, which it must be able to write.)
  using ConnectFn = std::function<std::shared_ptr<Connection>(Communicator& communicator, int peer)>;
  ConnectFn connect;
};

// What Comm::registerBuffer returns, for deregisterBuffer.
struct BufferRegistration {
  std::uint64_t id = 0;
};

class FERRY_API Comm {
 public:
  // Collective over the bootstrap's ranks. Uses the CUDA device current at construction; all ranks
  // must be on one host with peer access between their GPUs (NVLink or PCIe).
  // Throws Error(NotSupported) otherwise, naming the ranks that cannot reach each other.
  explicit Comm(std::shared_ptr<Bootstrap> bootstrap);
  // The same with options; Error(InvalidUsage) for negative bounds or minBlocks > maxBlocks.
  Comm(std::shared_ptr<Bootstrap> bootstrap, const CommOptions& options);
  // Waits first for the work this Comm queued (on the streams its calls used; bounded by
  // FERRY_DEVICE_TIMEOUT), not for the whole GPU: no kernel may still use its buffers.
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Why no Comm can be made over `bootstrap` (its ranks span hosts, or there are more of them than
  // ferry supports), decided alike on every rank from what the bootstrap knows; empty when one can.
  // (Whether the GPUs reach each other comes out only when the Comm is made.)
  static std::string whyNot(const Bootstrap& bootstrap);

  int rank() const noexcept;
  int worldSize() const noexcept;
  int device() const noexcept;

  // recv[i] = op over ranks of send[i], for i < count.
  void allReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                 cudaStream_t stream);
  // With the accumulation chosen (reduceScatter's of this signature says where Float32 runs).
  void allReduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                 Accumulation accumulation, cudaStream_t stream);
  // The same with a PreMulSum op. It runs as a scaling pass (into recv, then in place) before the sum.
  void allReduce(const void* send, void* recv, std::size_t count, DataType type, const PreMulSum& op,
                 cudaStream_t stream);
  // recv holds worldSize * sendCount elements; rank r's send lands at recv + r * sendCount.
  // In place: send == recv + rank * sendCount.
  void allGather(const void* send, void* recv, std::size_t sendCount, DataType type, cudaStream_t stream);
  // send holds worldSize * recvCount elements; rank r gets op over ranks of block r of send.
  // In place: recv == send + rank * recvCount.
  void reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type, ReduceOp op,
                     cudaStream_t stream);
  // With the accumulation of a sum or average of 16- and 8-bit floats chosen (ferry/datatype.hpp),
  // as the allReduce and reduce of that signature. Accumulation::Float32 runs on the algorithms that
  // meet every element's terms in one place (the _ll, _two_shot, _push, _direct and _ce ones), on
  // the ranks of one host; forcing another algorithm, or a Comm across hosts, gives
  // Error(InvalidUsage).
  void reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type, ReduceOp op,
                     Accumulation accumulation, cudaStream_t stream);
  // With a PreMulSum op: the scaled input goes to a buffer of the Comm (premul scratch) that grows
  // to the largest such call, never while the stream is captured (Error(InvalidUsage) then: run a
  // call of that size once before capturing).
  void reduceScatter(const void* send, void* recv, std::size_t recvCount, DataType type, const PreMulSum& op,
                     cudaStream_t stream);
  // send and recv hold worldSize * count elements: block p of rank r's send lands in block r of
  // rank p's recv. In place: send == recv.
  void allToAll(const void* send, void* recv, std::size_t count, DataType type, cudaStream_t stream);
  // recv[i] = root's send[i]; send is read on the root only (may be null elsewhere).
  void broadcast(const void* send, void* recv, std::size_t count, DataType type, int root,
                 cudaStream_t stream);
  // root's recv[i] = op over ranks of send[i]; recv is written on the root only (may be null
  // elsewhere). In place: send == recv.
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op, int root,
              cudaStream_t stream);
  // With the accumulation chosen (reduceScatter's of this signature says where Float32 runs).
  void reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
              Accumulation accumulation, int root, cudaStream_t stream);
  // With a PreMulSum op, through the premul scratch as reduceScatter's.
  void reduce(const void* send, void* recv, std::size_t count, DataType type, const PreMulSum& op, int root,
              cudaStream_t stream);

  // Point-to-point: `count` elements from this rank's `buffer` to rank `peer`'s recv, which must
  // name the same count and type. Sends and recvs between a pair of ranks match in the order they
  // were issued. Outside a group each is its own kernel and returns once it is queued; a send
  // finishes without its recv only while the peer's inbox holds it and all unreceived sends
  // before it (two chunks a lane: one message of up to 8 MiB, docs/collectives.md), so two ranks
  // that both send first and receive second must group the pair (as NCCL requires).
  // A rank may send to itself only within a group that also holds the matching recv.
  void send(const void* buffer, std::size_t count, DataType type, int peer, cudaStream_t stream);
  void recv(void* buffer, std::size_t count, DataType type, int peer, cudaStream_t stream);
  // Between groupStart() and the matching groupEnd() (they nest), send and recv are collected and
  // groupEnd() queues them all as one kernel in which they progress together (an all-to-all-v is
  // one group). One group's sends and recvs share one stream; at most 64 per group. Collectives
  // called inside a group are not deferred: they are queued at once.
  void groupStart();
  void groupEnd();

  // Registers [ptr, ptr + bytes) of this GPU's memory (cudaMalloc, PyTorch's allocator, gpuAlloc)
  // so that calls whose buffers lie inside registered ranges on every rank can run zero-copy:
  // kernels then read and write the peers' buffers directly instead of staging through scratch
  // (the *_direct algorithms, picked above the LL sizes). Collective: every rank registers its
  // buffer of the same role, in the same order (sizes may differ); a call that is registered on
  // some ranks but not on others is an error reported by the kernel. Ranges must not overlap.
  // At most 256 registrations are live at once (the Comm's staging buffers, docs/executor.md, count too).
  BufferRegistration registerBuffer(void* ptr, std::size_t bytes);
  // Local: waits for the work this Comm queued (not the whole GPU's; bounded by FERRY_DEVICE_TIMEOUT,
  // then a TimeoutError), then forgets the registration (deregister on every rank before the next
  // call that used it). Work captured into a graph is the caller's to finish first.
  void deregisterBuffer(BufferRegistration registration);

  // Stops this Comm on every rank, without waiting for its kernels: raises an abort flag in every
  // rank's Comm memory (copies that return in microseconds), after which every wait of the Comm's kernels (queued, running or later, on any rank)
  // gives up at once and the kernel runs to its end without finishing its call (outputs are then
  // undefined, and no kernel traps: streams and CUDA contexts stay usable). On this rank, later
  // calls are Error(InvalidUsage); on the others they return garbage at once until aborted() is
  // noticed. Destroying an aborted Comm does not hang. (A Comm across hosts, docs/multi-node.md: on
  // every rank of this rank's host, and on this rank's calls across hosts.)
  void abort();
  // True once any rank of this Comm called abort(). Reads the flag from the GPU on a stream of its
  // own (a few microseconds), so a watchdog can poll it while the caller's streams are busy. A Comm
  // across hosts is also aborted once a rank's partner on another host went away during a call: its
  // host's calls end then as if aborted, and its later calls throw Error(RemoteError) naming it.
  bool aborted() const;

  // The algorithms of this Comm, of every collective: the built-in ones grouped by collective, the
  // plans of FERRY_PLAN_DIR, then those added, in order of adding.
  std::vector<AlgorithmInfo> algorithms() const;
  // Collective (every rank, the same plan, in the same order as every other add and remove): adds
  // `plan` as the algorithm plan.algorithmName(), uploading this rank's program to the GPU.
  // Error(InvalidUsage) for a plan of another world size, a name already registered, or ranks that
  // add different algorithms.
  void addPlan(const Plan& plan);
  // Collective, as addPlan: calls algorithm->setup(*this) on every rank, then adds it where setup
  // succeeded on every rank (otherwise Error(InvalidUsage) on every rank, naming those that failed).
  void addAlgorithm(std::shared_ptr<NativeAlgorithm> algorithm);
  // Collective, as addPlan: removes the algorithm `name`, a built-in one too, and unforces it.
  // Work already queued still runs it: what it owns lives until the Comm goes.
  void removeAlgorithm(std::string_view name);
  // The Communicator under this Comm (ferry/communicator.hpp): for NativeAlgorithm::setup, which
  // connects its own channels to the same ranks.
  Communicator& communicator();

  // Forces the algorithm `name` for collective c (an empty name hands the choice back to the
  // selector). Error(InvalidUsage) for a name this Comm does not have or of another collective.
  // A forced algorithm that cannot run a call (too large for its buffers, say) makes that call
  // Error(InvalidUsage) naming why, instead of silently using another.
  void setAlgorithm(Collective c, std::string_view name);
  // The algorithm a call of `bytes` (the larger of input and output) would use, on registered
  // buffers or not.
  std::string algorithmFor(Collective c, std::size_t bytes, DataType type, bool registered = false) const;
  // Every algorithm of c that a new Comm starts with (built-in, then FERRY_PLAN_DIR's plans), in
  // registry order; algorithms() lists one Comm's.
  static std::vector<std::string> algorithmNames(Collective c);
  // How the Comm's GPUs are joined, as tuning rows name it: "nvswitch", "nvlink", "pcie", or
  // "unknown" (NVML could not tell, or one rank); the slowest over the ranks.
  std::string topology() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
