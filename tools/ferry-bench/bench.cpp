#include "bench.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/collective_data.hpp"
#include "common/cuda_check.hpp"
#include "ferry/env.hpp"
#include "ferry/errors.hpp"
#include "ferry/version.hpp"
#include "nccl_library.hpp"

namespace ferry::tools {
namespace {

// Per-rank counts (the size is the larger buffer's), an op, a root: of the collective b times
// (sendrecv: none of them).
bool perRank(Benchmark b) {
  return b == benchmarkOf(Collective::AllGather) || b == benchmarkOf(Collective::ReduceScatter) ||
         b == benchmarkOf(Collective::AllToAll);
}
bool reduces(Benchmark b) {
  const auto c = collectiveOf(b);
  return c && tools::reduces(*c);
}
bool rooted(Benchmark b) {
  const auto c = collectiveOf(b);
  return c && tools::rooted(*c);
}

// One call of a sweep. A collective's shape says everything about it. sendrecv's shape holds the
// type, count, rank, world size and seed (its `collective` means nothing): `count` elements go to
// sendPeer() and `count` come from recvPeer() into a buffer of their own.
struct Call {
  Benchmark benchmark;
  CallShape shape;

  bool sendRecv() const { return benchmark == Benchmark::SendRecv; }
  bool is(Collective c) const { return benchmark == benchmarkOf(c); }
  std::size_t sendCount() const { return sendRecv() ? shape.count : shape.sendCount(); }
  std::size_t recvCount() const { return sendRecv() ? shape.count : shape.recvCount(); }
  bool hasSend() const { return sendRecv() || shape.hasSend(); }
  int sendPeer() const { return (shape.rank + 1) % shape.worldSize; }
  int recvPeer() const { return (shape.rank - 1 + shape.worldSize) % shape.worldSize; }
  // In bytes, as the row shows it: the larger buffer of a collective; what one rank sends for sendrecv.
  std::uint64_t bytes() const {
    return shape.count * sizeOf(shape.type) *
           (perRank(benchmark) ? static_cast<std::uint64_t>(shape.worldSize) : 1);
  }
};

std::vector<std::uint64_t> sizes(const BenchOptions& o) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t s = o.minBytes; s <= o.maxBytes;) {
    out.push_back(s);
    const std::uint64_t next =
        o.stepBytes ? s + o.stepBytes : static_cast<std::uint64_t>(std::llround(s * o.stepFactor));
    if (next <= s) break;
    s = next;
  }
  return out;
}

// Device memory that frees itself: from cudaMalloc, or from another allocator (NCCL's) with its free.
struct DeviceMemory {
  void* ptr = nullptr;
  std::function<void(void*)> release;
  explicit DeviceMemory(std::size_t bytes) : release([](void* p) { cudaFree(p); }) {
    FERRY_TOOL_CUDA(cudaMalloc(&ptr, std::max<std::size_t>(bytes, 256)));
  }
  DeviceMemory(void* p, std::function<void(void*)> free) : ptr(p), release(std::move(free)) {}
  ~DeviceMemory() { release(ptr); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

class Runner {
 public:
  Runner(const BenchOptions& o, const RankInfo& r) : o_(o), r_(r) {
    FERRY_TOOL_CUDA(cudaSetDevice(r.localRank % o.gpus));
    FERRY_TOOL_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FERRY_TOOL_CUDA(cudaEventCreate(&start_));
    FERRY_TOOL_CUDA(cudaEventCreate(&stop_));
    comm_ = std::make_unique<Comm>(r.bootstrap);
    barrierBuf_ = std::make_unique<DeviceMemory>(64);
    // The real NCCL refuses ranks that share a GPU; a library named with --nccl (libferry_nccl.so) may not.
    if (o.nccl && (!sharing() || o.ncclPath != BenchOptions{}.ncclPath)) loadNccl();
  }
  ~Runner() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  int run() {
    printHeader();
    std::uint64_t wrongTotal = 0, ncclWrongTotal = 0;
    std::vector<TuningChoice> tuned;
    for (Benchmark b : o_.benchmarks) {
      for (DataType t : o_.types) {
        for (ReduceOp op : reduces(b) ? o_.ops : std::vector<ReduceOp>{ReduceOp::Sum}) {
          printTitle(b, t, op);
          Buffers buf = buffersFor(b, t);
          const NcclBuffers ncclBuf = ncclBuffersFor(b, t);
          for (std::uint64_t size : sizes(o_)) {
            Call call = callFor(b, t, op, size);
            if (call.shape.count == 0) continue;
            // sendrecv has no algorithms to choose from: nothing to tune.
            if (!o_.tunePath.empty() && !call.sendRecv()) tuned.push_back(tune(call, buf));
            BenchRow row;
            try {
              row = measure(call, buf, ncclBuf);
            } catch (const Error& e) {
              // A forced algorithm (--algo) that cannot run this size: every rank refuses it alike
              // before queueing anything, so the sweep goes on without the row. (No algorithm is
              // forced on sendrecv, and its error may leave a group open: it ends the run.)
              if (o_.algorithm.empty() || call.sendRecv() || e.code() != ErrorCode::InvalidUsage) throw;
              if (r_.rank == 0)
                std::printf("# %llu bytes: %s\n", static_cast<unsigned long long>(size), e.what());
              continue;
            }
            wrongTotal += row.outOfPlace.wrong + row.inPlace.wrong;
            for (const Measure& m : row.ncclVariants) ncclWrongTotal += m.wrong;
            if (r_.rank == 0) printRow(row);
            rows_.push_back(std::move(row));
          }
        }
      }
    }
    if (r_.rank == 0) {
      printFooter(wrongTotal, ncclWrongTotal);
      if (!o_.jsonPath.empty()) writeJson();
      if (!o_.tunePath.empty()) writeTuning(tuned);
    }
    return wrongTotal == 0 ? 0 : 1;
  }

 private:
  // More ranks than GPUs: ranks share them (checks results; times mean nothing).
  bool sharing() const { return r_.worldSize > o_.gpus; }

  struct Buffers {
    std::unique_ptr<DeviceMemory> send, recv;
    // Deregistrations (ferry's with -R, NCCL's for its registered and window variants): run before
    // the memory goes, the last registered first.
    std::vector<std::function<void()>> releases;
    Buffers() = default;
    Buffers(Buffers&&) = default;
    ~Buffers() {
      for (auto it = releases.rbegin(); it != releases.rend(); ++it) (*it)();
    }
  };
  // NCCL's own buffers for its registered and window variants (the plain one runs on ferry's),
  // indexed by NcclVariant; null where a variant is not measured.
  using NcclBuffers = std::array<std::unique_ptr<Buffers>, kNcclVariantCount>;
  struct TuningChoice {
    Collective collective;
    DataType type;
    std::uint64_t bytes;
    std::string algorithm;
  };

  void loadNccl() {
    if (!nvlsAllowed()) ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // architecture.md rule 1, for NCCL too
    std::string why;
    nccl_ = NcclLibrary::load(o_.ncclPath, why);
    // Every rank must agree, or the ranks that loaded it would wait for the others.
    std::vector<int> all(static_cast<std::size_t>(r_.worldSize));
    all[r_.rank] = nccl_ ? 1 : 0;
    r_.bootstrap->allGather(all.data(), sizeof(int));
    if (std::count(all.begin(), all.end(), 1) != r_.worldSize) {
      if (r_.rank == 0)
        std::printf("# NCCL not compared: %s\n", why.empty() ? "not loaded on every rank" : why.c_str());
      nccl_.reset();
      return;
    }
    NcclUniqueId id = r_.rank == 0 ? nccl_->uniqueId() : NcclUniqueId{};
    std::vector<NcclUniqueId> ids(static_cast<std::size_t>(r_.worldSize));
    ids[r_.rank] = id;
    r_.bootstrap->allGather(ids.data(), sizeof(NcclUniqueId));
    nccl_->initComm(ids[0], r_.rank, r_.worldSize);
  }

  Call callFor(Benchmark b, DataType t, ReduceOp op, std::uint64_t size) const {
    Call c{b, {}};
    CallShape& s = c.shape;
    if (const auto collective = collectiveOf(b)) s.collective = *collective;
    s.type = t;
    s.op = op;
    s.rank = r_.rank;
    s.worldSize = r_.worldSize;
    s.root = o_.root;
    s.count = size / sizeOf(t) / (perRank(b) ? static_cast<std::uint64_t>(r_.worldSize) : 1);
    return c;
  }

  Buffers buffersFor(Benchmark bench, DataType t) const {
    const Call c = callFor(bench, t, ReduceOp::Sum, o_.maxBytes);
    const std::size_t es = sizeOf(t);
    Buffers b;
    b.send = std::make_unique<DeviceMemory>(c.sendCount() * es);
    const std::size_t recvBytes = std::max(c.sendCount(), c.recvCount()) * es;
    b.recv = std::make_unique<DeviceMemory>(recvBytes);
    if (o_.registered) {  // collective: every rank registers the same two buffers, in this order
      Comm* comm = comm_.get();
      for (auto [ptr, bytes] : {std::pair{b.send->ptr, c.sendCount() * es}, std::pair{b.recv->ptr, recvBytes}}) {
        BufferRegistration reg = comm->registerBuffer(ptr, std::max<std::size_t>(bytes, 256));
        b.releases.push_back([comm, reg] { comm->deregisterBuffer(reg); });
      }
    }
    return b;
  }

  // The buffers of each NCCL variant asked for but the plain one: a variant the library cannot set
  // up (too old, or its registration fails on some rank) is said once and left out.
  NcclBuffers ncclBuffersFor(Benchmark bench, DataType t) {
    NcclBuffers out;
    if (!nccl_) return out;
    for (NcclVariant v : o_.ncclVariants) {
      const auto i = static_cast<std::size_t>(v);
      if (v == NcclVariant::Plain || ncclVariantOff_[i]) continue;
      std::string why;
      try {
        out[i] = ncclOwnBuffers(bench, t, v);
      } catch (const std::exception& e) {
        why = e.what();
      }
      // Every rank must agree, or some would time calls the others never make.
      std::vector<int> ok(static_cast<std::size_t>(r_.worldSize));
      ok[r_.rank] = out[i] ? 1 : 0;
      r_.bootstrap->allGather(ok.data(), sizeof(int));
      if (std::count(ok.begin(), ok.end(), 1) == r_.worldSize) continue;
      out[i].reset();
      ncclVariantOff_[i] = true;
      if (r_.rank == 0)
        std::printf("# NCCL %s buffers: not measured (%s)\n", std::string(ncclVariantName(v)).c_str(),
                    why.empty() ? "they could not be set up on another rank" : why.c_str());
    }
    return out;
  }

  // As nccl-tests' -R 1 and -R 2: both buffers from ncclMemAlloc, registered with NCCL's comm
  // (ncclCommRegister) or as symmetric windows (ncclCommWindowRegister, collective: every rank the
  // same sizes in the same order).
  std::unique_ptr<Buffers> ncclOwnBuffers(Benchmark bench, DataType t, NcclVariant v) const {
    const Call c = callFor(bench, t, ReduceOp::Sum, o_.maxBytes);
    const std::size_t es = sizeOf(t);
    const std::size_t sendBytes = std::max<std::size_t>(c.sendCount() * es, 256);
    const std::size_t recvBytes = std::max<std::size_t>(std::max(c.sendCount(), c.recvCount()) * es, 256);
    const NcclLibrary* nccl = nccl_.get();
    auto b = std::make_unique<Buffers>();
    b->send = std::make_unique<DeviceMemory>(nccl->memAlloc(sendBytes), [nccl](void* p) { nccl->memFree(p); });
    b->recv = std::make_unique<DeviceMemory>(nccl->memAlloc(recvBytes), [nccl](void* p) { nccl->memFree(p); });
    for (auto [ptr, bytes] : {std::pair{b->send->ptr, sendBytes}, std::pair{b->recv->ptr, recvBytes}}) {
      if (v == NcclVariant::Registered) {
        void* handle = nccl->registerBuffer(ptr, bytes);
        b->releases.push_back([nccl, handle] { nccl->deregisterBuffer(handle); });
      } else {
        void* window = nccl->registerWindow(ptr, bytes);
        b->releases.push_back([nccl, window] { nccl->deregisterWindow(window); });
      }
    }
    return b;
  }

  // The pointers of one call; in place they follow the API's in-place rule inside recv (sendrecv
  // never runs in place).
  std::pair<const void*, void*> pointers(const Call& c, const Buffers& b, bool inPlace) const {
    char* recv = static_cast<char*>(b.recv->ptr);
    if (!inPlace) return {b.send->ptr, recv};
    const std::size_t off = static_cast<std::size_t>(c.shape.rank) * c.shape.count * sizeOf(c.shape.type);
    if (c.is(Collective::AllGather)) return {recv + off, recv};
    if (c.is(Collective::ReduceScatter)) return {recv, recv + off};
    return {recv, recv};
  }

  void issueFerry(const Call& c, const void* send, void* recv) {
    const CallShape& s = c.shape;
    if (c.sendRecv()) {
      comm_->groupStart();
      comm_->send(send, s.count, s.type, c.sendPeer(), stream_);
      comm_->recv(recv, s.count, s.type, c.recvPeer(), stream_);
      comm_->groupEnd();
      return;
    }
    switch (s.collective) {
      case Collective::AllReduce:
        comm_->allReduce(send, recv, s.count, s.type, s.op, s.accumulation, stream_);
        break;
      case Collective::AllGather: comm_->allGather(send, recv, s.count, s.type, stream_); break;
      case Collective::ReduceScatter:
        comm_->reduceScatter(send, recv, s.count, s.type, s.op, s.accumulation, stream_);
        break;
      case Collective::AllToAll: comm_->allToAll(send, recv, s.count, s.type, stream_); break;
      case Collective::Broadcast: comm_->broadcast(send, recv, s.count, s.type, s.root, stream_); break;
      case Collective::Reduce:
        comm_->reduce(send, recv, s.count, s.type, s.op, s.accumulation, s.root, stream_);
        break;
    }
  }

  void issueNccl(const Call& c, const void* send, void* recv) {
    const CallShape& s = c.shape;
    const int t = static_cast<int>(s.type), op = static_cast<int>(s.op);
    if (c.sendRecv()) return nccl_->sendRecv(send, recv, s.count, t, c.sendPeer(), c.recvPeer(), stream_);
    switch (s.collective) {
      case Collective::AllReduce: nccl_->allReduce(send, recv, s.count, t, op, stream_); break;
      case Collective::AllGather: nccl_->allGather(send, recv, s.count, t, stream_); break;
      case Collective::ReduceScatter: nccl_->reduceScatter(send, recv, s.count, t, op, stream_); break;
      case Collective::AllToAll: nccl_->allToAll(send, recv, s.count, t, stream_); break;
      case Collective::Broadcast: nccl_->broadcast(send, recv, s.count, t, s.root, stream_); break;
      case Collective::Reduce: nccl_->reduce(send, recv, s.count, t, op, s.root, stream_); break;
    }
  }

  // Runs `issue` once on random input with the output poisoned, and counts the wrong elements on
  // this rank. reordered: the library reduces in its own order (NCCL, a ring, a plan), so floats get
  // countWrongReordered's tolerance; ferry's other algorithms reduce in rank order, as the reference
  // does, and must match it exactly.
  std::uint64_t check(const Call& c, const Buffers& b, bool inPlace,
                      const std::function<void(const void*, void*)>& issue, bool reordered = false) {
    const CallShape& s = c.shape;
    const std::size_t es = sizeOf(s.type);
    auto [send, recv] = pointers(c, b, inPlace);
    std::vector<char> host(c.sendCount() * es);
    fillSend(s.type, host.data(), c.sendCount(), s.rank, s.seed);
    if (!(inPlace && c.is(Collective::ReduceScatter)))
      FERRY_TOOL_CUDA(cudaMemset(recv, kPoisonByte, c.recvCount() * es));
    if (c.hasSend())
      FERRY_TOOL_CUDA(cudaMemcpy(const_cast<void*>(send), host.data(), host.size(), cudaMemcpyHostToDevice));
    FERRY_TOOL_CUDA(cudaDeviceSynchronize());
    r_.bootstrap->barrier();
    issue(send, recv);
    FERRY_TOOL_CUDA(cudaStreamSynchronize(stream_));
    std::vector<char> got(c.recvCount() * es), want(c.recvCount() * es);
    FERRY_TOOL_CUDA(cudaMemcpy(got.data(), recv, got.size(), cudaMemcpyDeviceToHost));
    if (c.sendRecv())  // what recvPeer() sent: its send buffer, filled as this rank filled its own
      fillSend(s.type, want.data(), c.recvCount(), c.recvPeer(), s.seed);
    else
      expectedRecv(s, want.data(), inPlace);
    if (reordered && reduces(c.benchmark))
      return countWrongReordered(s.type, s.op, r_.worldSize, got.data(), want.data(), c.recvCount());
    return countWrong(s.type, got.data(), want.data(), c.recvCount());
  }

  // Median microseconds per call, measured on this rank. `align` runs one small collective of the
  // same library first, so every rank starts the timed calls together.
  double time(const std::function<void()>& call, const std::function<void()>& align) {
    for (int i = 0; i < o_.warmup; ++i) call();
    FERRY_TOOL_CUDA(cudaStreamSynchronize(stream_));
    cudaGraphExec_t exec = nullptr;
    if (o_.graphLaunches > 0) {
      cudaGraph_t graph;
      FERRY_TOOL_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < o_.iters; ++i) call();
      FERRY_TOOL_CUDA(cudaStreamEndCapture(stream_, &graph));
      FERRY_TOOL_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      FERRY_TOOL_CUDA(cudaGraphDestroy(graph));
      FERRY_TOOL_CUDA(cudaGraphLaunch(exec, stream_));  // uploads the graph
      FERRY_TOOL_CUDA(cudaStreamSynchronize(stream_));
    }
    std::vector<double> us;
    for (int k = 0; k < o_.samples; ++k) {
      r_.bootstrap->barrier();
      align();
      FERRY_TOOL_CUDA(cudaEventRecord(start_, stream_));
      int calls = o_.iters;
      if (exec) {
        for (int g = 0; g < o_.graphLaunches; ++g) FERRY_TOOL_CUDA(cudaGraphLaunch(exec, stream_));
        calls *= o_.graphLaunches;
      } else {
        for (int i = 0; i < o_.iters; ++i) call();
      }
      FERRY_TOOL_CUDA(cudaEventRecord(stop_, stream_));
      FERRY_TOOL_CUDA(cudaEventSynchronize(stop_));
      float ms = 0;
      FERRY_TOOL_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
      us.push_back(ms * 1000.0 / calls);
    }
    if (exec) cudaGraphExecDestroy(exec);
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }

  // Median host microseconds per eager call: the time `iters` calls take to return, issued back to
  // back on the stream (far fewer than fill CUDA's launch queue, so no call waits for the GPU).
  // Every rank issues the same calls, so the collectives pair up; the stream drains between samples.
  // Sizes above 4 MiB take one sample (the host time does not depend on the size; the GPU time does).
  double hostTime(const std::function<void()>& call, std::uint64_t bytes) {
    const int samples = bytes <= (4u << 20) ? o_.samples : 1;
    std::vector<double> us;
    for (int k = 0; k < samples; ++k) {
      FERRY_TOOL_CUDA(cudaStreamSynchronize(stream_));
      r_.bootstrap->barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < o_.iters; ++i) call();
      const auto stop = std::chrono::steady_clock::now();
      us.push_back(std::chrono::duration<double, std::micro>(stop - start).count() / o_.iters);
    }
    FERRY_TOOL_CUDA(cudaStreamSynchronize(stream_));
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }

  void alignFerry() {
    // Not through an allreduce forced with --algo: a plan, say, may refuse this in-place call. The
    // forced one comes back even if the call throws, so later rows never run unforced.
    struct Unforce {
      Comm& comm;
      const std::string& name;
      explicit Unforce(Comm& c, const std::string& n) : comm(c), name(n) {
        if (!name.empty()) comm.setAlgorithm(Collective::AllReduce, "");
      }
      ~Unforce() {
        if (!name.empty()) comm.setAlgorithm(Collective::AllReduce, name);
      }
    } unforce(*comm_, allReduceForced_);
    comm_->allReduce(barrierBuf_->ptr, barrierBuf_->ptr, 1, DataType::Float32, ReduceOp::Max, stream_);
  }
  void alignNccl() {
    nccl_->allReduce(barrierBuf_->ptr, barrierBuf_->ptr, 1, static_cast<int>(DataType::Float32),
                     static_cast<int>(ReduceOp::Max), stream_);
  }

  // Whether the algorithm that runs call c sums in rank order, as the reference does (so its floats
  // must match exactly); the others (rings, plans) get the tolerance of a reduction in another order.
  bool reducesInRankOrder(const Call& c) {
    if (c.sendRecv()) return true;
    const std::string algo = comm_->algorithmFor(c.shape.collective, c.bytes(), c.shape.type, o_.registered);
    for (const AlgorithmInfo& a : comm_->algorithms())
      if (a.name == algo) return a.reducesInRankOrder;
    return false;
  }

  Measure measureFerry(const Call& c, const Buffers& b, bool inPlace) {
    Measure m;
    if (o_.check)
      m.wrong = check(
          c, b, inPlace, [&](const void* send, void* recv) { issueFerry(c, send, recv); }, !reducesInRankOrder(c));
    auto [send, recv] = pointers(c, b, inPlace);
    m.us = time([&] { issueFerry(c, c.hasSend() ? send : nullptr, recv); }, [&] { alignFerry(); });
    if (!inPlace) m.hostUs = hostTime([&] { issueFerry(c, c.hasSend() ? send : nullptr, recv); }, c.bytes());
    return m;
  }

  // Max time and total wrong over ranks.
  Measure reduceOverRanks(Measure m) {
    struct Wire {
      double us;
      std::uint64_t wrong;
      double hostUs;
    };
    std::vector<Wire> all(static_cast<std::size_t>(r_.worldSize));
    all[r_.rank] = {m.us, m.wrong, m.hostUs};
    r_.bootstrap->allGather(all.data(), sizeof(Wire));
    Measure out{m.us, 0, m.hostUs};
    for (const Wire& w : all) {
      out.us = std::max(out.us, w.us);
      out.wrong += w.wrong;
      out.hostUs = std::max(out.hostUs, w.hostUs);
    }
    return out;
  }

  // NCCL out of place on b, its result checked (with the tolerance of a reduction in another order).
  Measure measureNccl(const Call& c, const Buffers& b) {
    auto [send, recv] = pointers(c, b, false);
    Measure m;
    if (o_.check)
      m.wrong = check(
          c, b, false, [&](const void* in, void* out) { issueNccl(c, in, out); }, true);
    m.us = time([&] { issueNccl(c, send, recv); }, [&] { alignNccl(); });
    m.hostUs = hostTime([&] { issueNccl(c, send, recv); }, c.bytes());
    return m;
  }

  BenchRow measure(Call c, const Buffers& b, const NcclBuffers& ncclBuf) {
    CallShape& s = c.shape;
    BenchRow row{c.benchmark, c.bytes(), s.count, s.type, s.op, s.root, "", {}, {}, {}, {}, -1};
    // ferry's send/recv have one kernel (collectives/p2p.hpp), no algorithms to choose from.
    row.algorithm =
        c.sendRecv() ? "p2p" : comm_->algorithmFor(s.collective, row.bytes, s.type, o_.registered);
    // ferry's calls accumulate as asked, and their reference with them (collective_data.hpp);
    // NCCL's always step.
    s.accumulation = o_.accumulation;
    s.seed = ++seed_;
    row.outOfPlace = reduceOverRanks(measureFerry(c, b, false));
    // sendrecv in place would send a buffer while receiving into it: not a defined call (nccl-tests
    // times it but does not check it), so its in-place columns stay empty.
    if (o_.inPlace && !c.sendRecv()) {
      s.seed = ++seed_;
      row.inPlace = reduceOverRanks(measureFerry(c, b, true));
    }
    s.accumulation = Accumulation::Stepwise;
    for (NcclVariant v : nccl_ ? o_.ncclVariants : std::vector<NcclVariant>{}) {
      const auto i = static_cast<std::size_t>(v);
      const Buffers* nb = v == NcclVariant::Plain ? &b : ncclBuf[i].get();
      if (nb == nullptr) continue;
      s.seed = ++seed_;
      row.ncclVariants[i] = reduceOverRanks(measureNccl(c, *nb));
      if (row.ncclBest < 0 || row.ncclVariants[i].us < row.nccl.us) {
        row.nccl = row.ncclVariants[i];
        row.ncclBest = static_cast<int>(i);
      }
    }
    return row;
  }

  // Times every algorithm that can run the call (each checked first) and keeps the fastest.
  // @pre c is a collective's call.
  TuningChoice tune(Call c, const Buffers& b) {
    CallShape& s = c.shape;
    TuningChoice best{s.collective, s.type, c.bytes(), ""};
    double bestUs = 1e300;
    for (const std::string& name : Comm::algorithmNames(s.collective)) {
      force(s.collective, name);
      Measure m;
      try {
        s.seed = ++seed_;
        m = reduceOverRanks(measureFerry(c, b, false));
      } catch (const Error& e) {
        if (e.code() != ErrorCode::InvalidUsage) throw;
        continue;  // this algorithm cannot run the call
      }
      if (m.wrong == 0 && m.us < bestUs) {
        bestUs = m.us;
        best.algorithm = name;
      }
    }
    force(s.collective, "");
    applyForced();
    return best;
  }

  void force(Collective c, const std::string& name) {
    comm_->setAlgorithm(c, name);
    if (c == Collective::AllReduce) allReduceForced_ = name;
  }

 public:
  void applyForced() {
    if (o_.algorithm.empty()) return;
    for (Benchmark b : o_.benchmarks) {
      const auto c = collectiveOf(b);
      if (!c) continue;  // sendrecv: no algorithms
      const auto names = Comm::algorithmNames(*c);
      if (std::find(names.begin(), names.end(), o_.algorithm) != names.end()) force(*c, o_.algorithm);
    }
  }

 private:
  void printHeader() {
    if (r_.rank != 0) return;
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, r_.localRank % o_.gpus);
    std::printf("# ferry-bench %s: %d ranks, %s (%s)\n", FERRY_VERSION_STRING, r_.worldSize,
                sharing() ? "sharing GPUs" : "one per GPU", prop.name);
    if (sharing())
      std::printf(
          "# RANKS SHARE GPUS (%d ranks on %d): every result is checked, but the times say nothing about "
          "the hardware (and the real NCCL, which refuses shared GPUs, is not run)\n",
          r_.worldSize, o_.gpus);
    std::printf("# %s, %d calls per sample, median of %d samples, %d warm-up calls; checked: %s\n",
                o_.graphLaunches > 0 ? "CUDA graphs" : "stream launches",
                o_.iters * std::max(1, o_.graphLaunches), o_.samples, o_.warmup,
                o_.check ? "every size, random input, poisoned output" : "no");
    std::printf("# topology: %s\n", comm_->topology().c_str());
    std::printf("# host: microseconds one eager call (out of place, not captured) takes to return%s\n",
                nccl_ ? "; ferry's, then NCCL's" : "");
    std::printf("# ferry's buffers: %s\n",
                o_.registered ? "registered (Comm::registerBuffer; zero-copy above the LL sizes)"
                              : "not registered (staged through scratch)");
    if (nccl_) {
      std::string variants;
      for (NcclVariant v : o_.ncclVariants) variants += (variants.empty() ? "" : ", ") + std::string(ncclVariantName(v));
      std::printf(
          "# NCCL %s in the same run (out of place, its result checked too), on %s buffers: plain = "
          "ferry's (cudaMalloc), registered = ncclMemAlloc + ncclCommRegister, window = ncclMemAlloc + "
          "ncclCommWindowRegister (symmetric); busbw and ratio are the fastest NCCL's: ratio = its time / "
          "ferry's time\n",
          nccl_->versionString().c_str(), variants.c_str());
    }
  }

  // The NCCL columns' headers, three lines: one time column per variant, then the fastest's
  // busbw, ratio and the wrong values of all variants.
  std::array<std::string, 3> ncclHeaders() const {
    std::array<std::string, 3> h;
    if (!nccl_) return h;
    for (NcclVariant v : o_.ncclVariants) {
      char col[16];
      std::snprintf(col, sizeof col, " %10s", std::string(ncclVariantName(v)).c_str());
      h[0] += v == o_.ncclVariants.front() ? "       NCCL" : "           ";
      h[1] += col;
      h[2] += "       (us)";
    }
    h[0] += "                     ";
    h[1] += "   busbw  ratio #wrong";
    h[2] += "  (GB/s)              ";
    return h;
  }

  void printTitle(Benchmark b, DataType t, ReduceOp op) {
    if (r_.rank != 0) return;
    std::printf("#\n# %s %s %s\n", std::string(benchmarkName(b)).c_str(), std::string(toString(t)).c_str(),
                reduces(b) ? std::string(toString(op)).c_str() : "");
    if (b == Benchmark::SendRecv)
      std::printf(
          "# every rank sends count elements to rank + 1 and receives count from rank - 1, in one group; "
          "out of place only; busbw = algbw\n");
    const auto nh = ncclHeaders();
    std::printf(
        "#                                                      out-of-place                       in-place  "
        "        ");
    std::printf("%s\n", nh[0].c_str());
    std::printf(
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
        "algbw   busbw #wrong");
    std::printf("%s   host%s  algorithm\n", nh[1].c_str(), nccl_ ? "  nccl" : "");
    std::printf(
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
        "(GB/s)  (GB/s)       ");
    std::printf("%s   (us)%s\n", nh[2].c_str(), nccl_ ? "  (us)" : "");
    std::fflush(stdout);
  }

  void printRow(const BenchRow& r) {
    const double factor = busFactor(r.benchmark, r_.worldSize);
    auto cols = [&](const Measure& m) {
      if (m.us < 0) {
        std::printf(" %8s %7s %7s %6s", "-", "-", "-", "-");
        return;
      }
      const double algbw = r.bytes / m.us / 1e3;
      std::printf(" %8.2f %7.2f %7.2f %6llu", m.us, algbw, algbw * factor,
                  static_cast<unsigned long long>(m.wrong));
    };
    std::printf("%12llu  %12llu  %8s  %6s  %6d", static_cast<unsigned long long>(r.bytes),
                static_cast<unsigned long long>(r.count), std::string(toString(r.type)).c_str(),
                reduces(r.benchmark) ? std::string(toString(r.op)).c_str() : "none",
                rooted(r.benchmark) ? r.root : -1);
    cols(r.outOfPlace);
    cols(r.inPlace);
    if (nccl_) {
      std::uint64_t wrong = 0;
      for (NcclVariant v : o_.ncclVariants) {
        const Measure& m = r.ncclVariants[static_cast<std::size_t>(v)];
        if (m.us < 0)
          std::printf(" %10s", "-");
        else
          std::printf(" %10.2f", m.us);
        wrong += m.wrong;
      }
      if (r.ncclBest < 0)
        std::printf(" %7s %6s %6s", "-", "-", "-");
      else
        std::printf(" %7.2f %6.2f %6llu", r.bytes / r.nccl.us / 1e3 * factor, r.nccl.us / r.outOfPlace.us,
                    static_cast<unsigned long long>(wrong));
    }
    // Host time per eager call, out of place: ferry's, then the fastest NCCL's.
    std::printf(" %6.2f", r.outOfPlace.hostUs);
    if (nccl_) std::printf(" %5.2f", r.nccl.hostUs);
    std::printf("  %s\n", r.algorithm.c_str());
    std::fflush(stdout);
  }

  // NCCL's wrong values are reported, but only ferry's fail the run.
  void printFooter(std::uint64_t wrong, std::uint64_t ncclWrong) {
    double sum = 0;
    int n = 0;
    for (const auto& r : rows_) {
      sum += r.bytes / r.outOfPlace.us / 1e3 * busFactor(r.benchmark, r_.worldSize);
      ++n;
    }
    std::printf("# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong),
                wrong ? "FAILED" : "OK");
    if (nccl_ && o_.check)
      std::printf("# NCCL's wrong values  : %llu%s\n", static_cast<unsigned long long>(ncclWrong),
                  ncclWrong ? " (NCCL's own results: reported, not failed)" : "");
    std::printf("# Avg bus bandwidth    : %g\n", n ? sum / n : 0.0);
    std::printf("#\n");
  }

  void writeJson() {
    nlohmann::json doc;
    doc["tool"] = "ferry-bench";
    doc["version"] = FERRY_VERSION_STRING;
    doc["world_size"] = r_.worldSize;
    doc["graph"] = o_.graphLaunches > 0;
    doc["graph_launches"] = o_.graphLaunches;
    doc["accumulation"] = o_.accumulation == Accumulation::Float32 ? "float32" : "stepwise";
    doc["registered"] = o_.registered;
    doc["iters"] = o_.iters;
    doc["samples"] = o_.samples;
    doc["nccl_version"] = nccl_ ? nccl_->versionString() : "";
    auto measure = [&](const Measure& m, const BenchRow& r) -> nlohmann::json {
      if (m.us < 0) return nullptr;
      const double algbw = r.bytes / m.us / 1e3;
      return {{"time_us", m.us},
              {"host_us", m.hostUs < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.hostUs)},
              {"algbw", algbw},
              {"busbw", algbw * busFactor(r.benchmark, r_.worldSize)},
              {"wrong", m.wrong}};
    };
    auto ncclVariantsJson = [&](const BenchRow& r) {
      nlohmann::json out = nlohmann::json::object();
      for (int i = 0; i < kNcclVariantCount; ++i)
        out[std::string(ncclVariantName(static_cast<NcclVariant>(i)))] = measure(r.ncclVariants[i], r);
      return out;
    };
    doc["rows"] = nlohmann::json::array();
    for (const auto& r : rows_)
      doc["rows"].push_back({{"collective", std::string(benchmarkName(r.benchmark))},
                             {"bytes", r.bytes},
                             {"count", r.count},
                             {"type", std::string(toString(r.type))},
                             {"op", std::string(toString(r.op))},
                             {"root", r.root},
                             {"algorithm", r.algorithm},
                             {"out_of_place", measure(r.outOfPlace, r)},
                             {"in_place", measure(r.inPlace, r)},
                             {"nccl", measure(r.nccl, r)},
                             {"nccl_variant", r.ncclBest < 0 ? nlohmann::json(nullptr)
                                                             : nlohmann::json(std::string(ncclVariantName(
                                                                   static_cast<NcclVariant>(r.ncclBest))))},
                             {"nccl_variants", ncclVariantsJson(r)}});
    std::ofstream(o_.jsonPath) << doc.dump(2) << "\n";
    std::printf("# results: %s\n", o_.jsonPath.c_str());
  }

  void writeTuning(const std::vector<TuningChoice>& choices) {
    // One row per run of sizes with the same winner, up to the last size it won, for the data type
    // and the registration (-R) it was measured with, and the topology it was measured on (none
    // when NVML could not tell: the rows then apply anywhere).
    nlohmann::json doc = {{"version", 1}, {"rows", nlohmann::json::array()}};
    const std::string topology = comm_->topology();
    for (std::size_t i = 0; i < choices.size(); ++i) {
      const auto& c = choices[i];
      if (c.algorithm.empty()) continue;
      const bool last = i + 1 == choices.size() || choices[i + 1].collective != c.collective ||
                        choices[i + 1].type != c.type || choices[i + 1].bytes <= c.bytes;  // a new sweep
      if (!last && choices[i + 1].algorithm == c.algorithm) continue;
      doc["rows"].push_back({{"collective", std::string(toString(c.collective))},
                             {"world_size", r_.worldSize},
                             {"datatype", std::string(toString(c.type))},
                             {"registered", o_.registered},
                             {"max_bytes", last ? ~0ull : c.bytes},
                             {"algorithm", c.algorithm}});
      if (topology != "unknown") doc["rows"].back()["topology"] = topology;
    }
    std::ofstream(o_.tunePath) << doc.dump(2) << "\n";
    std::printf("# tuning table: %s (use it with FERRY_TUNING_FILE=%s)\n", o_.tunePath.c_str(),
                o_.tunePath.c_str());
  }

  const BenchOptions& o_;
  const RankInfo& r_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<DeviceMemory> barrierBuf_;
  std::string allReduceForced_;  // what force() set for allreduce (alignFerry steps around it)
  std::unique_ptr<NcclLibrary> nccl_;
  std::array<bool, kNcclVariantCount> ncclVariantOff_{};  // could not be set up: left out of the run
  std::vector<BenchRow> rows_;
  std::uint64_t seed_ = 0;
};

}  // namespace

std::string_view ncclVariantName(NcclVariant v) {
  switch (v) {
    case NcclVariant::Plain: return "plain";
    case NcclVariant::Registered: return "registered";
    case NcclVariant::Window: return "window";
  }
  return "?";
}

std::optional<NcclVariant> parseNcclVariant(std::string_view name) {
  for (int i = 0; i < kNcclVariantCount; ++i)
    if (name == ncclVariantName(static_cast<NcclVariant>(i))) return static_cast<NcclVariant>(i);
  return std::nullopt;
}

std::string_view benchmarkName(Benchmark b) {
  if (const auto c = collectiveOf(b)) return toString(*c);
  return "sendrecv";
}

std::optional<Benchmark> parseBenchmark(std::string_view name) {
  std::string n;
  for (char ch : name)
    if (ch != '_') n += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (n == "sendrecv") return Benchmark::SendRecv;
  if (const auto c = parseCollective(name)) return benchmarkOf(*c);
  return std::nullopt;
}

double busFactor(Benchmark b, int n) {
  const auto c = collectiveOf(b);
  if (!c) return 1.0;  // sendrecv: each rank's bytes cross one link once
  switch (*c) {
    case Collective::AllReduce: return 2.0 * (n - 1) / n;
    case Collective::Broadcast:
    case Collective::Reduce: return 1.0;
    default: return static_cast<double>(n - 1) / n;
  }
}

int runBench(const BenchOptions& options, const RankInfo& rank) {
  Runner runner(options, rank);
  runner.applyForced();
  return runner.run();
}

}  // namespace ferry::tools
