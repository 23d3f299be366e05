// The direct (zero-copy) algorithms: on buffers registered with Comm::registerBuffer on every rank,
// kernels read and write the peers' own send and recv buffers over NVLink; nothing is staged in
// scratch, and each call synchronizes once at its start and once at its end (direct_call.cuh).
//   allreduce_direct      rank r reduces chunk r of every rank's input (in rank order) and writes
//                         the result into chunk r of every rank's output: reduce-scatter and
//                         all-gather in one pass.
//   reduce_direct         the same into the root's output only: the root's links carry each byte
//                         twice (its chunks in, everyone's result out), not R - 1 times.
//   reducescatter_direct  rank r reduces block r of every rank's input into its own output.
//   allgather_direct      rank r writes its input into block r of every rank's output.
//   alltoall_direct       rank r writes block p of its input into block r of rank p's output
//                         (out of place only: in place, a peer's block would overwrite one not yet
//                         sent).
//   broadcast_direct      rank r reads chunk r of the root's input and writes it into chunk r of
//                         every rank's output, so the root's links carry each byte once.
#include "collectives/builtin.hpp"
#include "kernels/direct_call.cuh"
#include "kernels/kernel_util.cuh"
#include "kernels/launch.hpp"
#include "ferry/device/copy.hpp"

namespace ferry {
namespace {

// Elements [begin, end) of chunk j when `count` elements are cut into R chunks of `grain`
// multiples, and this block's share of it.
FERRY_DEVICE FERRY_INLINE Range blockShare(std::uint64_t count, int R, int j, std::uint64_t grain) {
  const std::uint64_t chunk = partSize(count, R, grain);
  const Range part = splitRange(chunk, gridDim.x, blockIdx.x, grain);
  return {min(j * chunk + part.begin, count), min(j * chunk + part.end, count)};
}

// root < 0: allreduce (every rank's output); otherwise reduce into root's output. Wide: float32
// accumulation (WordAccumulator).
template <class T, ReduceOp Op, bool Wide>
__global__ void __launch_bounds__(kThreads)
    allReduceDirect(CollectiveContext c, CallBuffers mine, const char* send, char* recv, std::uint64_t count,
                    int root) {
  __shared__ DirectBuffers b;
  constexpr std::uint64_t sz = sizeof(T);
  const std::uint64_t m = beginDirect(c, mine, send, recv, b, root < 0 ? ~0u : 1u << root);
  const int R = c.nranks;
  const Range el = blockShare(count, R, c.rank, 16 / sz);
  const char* src[kMaxRanks];
  char* dst[kMaxRanks];
  int nd = 0;
  for (int q = 0; q < R; ++q) {
    src[q] = b.send[q] + el.begin * sz;
    // Null only for a reduce's root after an abort (beginDirect's stand-in): nothing to write.
    if ((root < 0 || q == root) && b.recv[q] != nullptr) dst[nd++] = b.recv[q] + el.begin * sz;
  }
  if (nd > 0) reduceSources<T, Op, Wide>(dst, nd, src, R, R, el.size(), threadIdx.x, kThreads);
  finishDirect(c, m);
}

// Wide: float32 accumulation (WordAccumulator).
template <class T, ReduceOp Op, bool Wide>
__global__ void __launch_bounds__(kThreads)
    reduceScatterDirect(CollectiveContext c, CallBuffers mine, const char* send, char* recv, std::uint64_t count) {
  __shared__ DirectBuffers b;
  constexpr std::uint64_t sz = sizeof(T);
  const std::uint64_t m = beginDirect(c, mine, send, recv, b);
  const int R = c.nranks, r = c.rank;
  const Range el = blockShare(count, 1, 0, 16 / sz);
  const char* src[kMaxRanks];
  for (int q = 0; q < R; ++q) src[q] = b.send[q] + (r * count + el.begin) * sz;
  char* dst[1] = {recv + el.begin * sz};
  reduceSources<T, Op, Wide>(dst, 1, src, R, R, el.size(), threadIdx.x, kThreads);
  finishDirect(c, m);
}

// AllGather, AllToAll and Broadcast: copies only.
enum class Move { AllGather, AllToAll, Broadcast };

template <Move Kind>
__global__ void __launch_bounds__(kThreads)
    moveDirect(CollectiveContext c, CallBuffers mine, const char* send, char* recv, std::uint64_t bytes, int root) {
  __shared__ DirectBuffers b;
  const std::uint64_t m = beginDirect(c, mine, send, recv, b);
  const int R = c.nranks, r = c.rank;
  char* dst[kMaxRanks];
  int nd = 0;
  if constexpr (Kind == Move::Broadcast) {
    const Range part = blockShare(bytes, R, r, 16);
    for (int i = 0; i < R; ++i) {
      const int q = (r + i) % R;
      if (b.recv[q] != b.send[root]) dst[nd++] = b.recv[q] + part.begin;  // not the root's own, in place
    }
    copyToMany(dst, nd, b.send[root] + part.begin, part.size(), threadIdx.x, kThreads);
  } else if constexpr (Kind == Move::AllGather) {
    const Range part = blockShare(bytes, 1, 0, 16);
    for (int i = 0; i < R; ++i) {
      const int q = (r + i) % R;  // start at a different peer on every rank
      if (b.recv[q] + r * bytes != send) dst[nd++] = b.recv[q] + r * bytes + part.begin;  // not in place
    }
    copyToMany(dst, nd, send + part.begin, part.size(), threadIdx.x, kThreads);
  } else {
    const Range part = blockShare(bytes, 1, 0, 16);
    for (int i = 0; i < R; ++i) {
      const int q = (r + i) % R;
      copy(b.recv[q] + r * bytes + part.begin, send + q * bytes + part.begin, part.size(), threadIdx.x, kThreads);
    }
  }
  finishDirect(c, m);
}

class DirectAlgorithm : public Algorithm {
 public:
  DirectAlgorithm(const char* name, Collective c) : name_(name), collective_(c) {}
  const char* name() const override { return name_; }
  Collective collective() const override { return collective_; }
  std::string whyNot(const CollectiveCall& call, const CommLimits&) const override { return whyNotZeroCopy(call); }
  std::string constraints(const CommLimits&) const override { return "registered buffers only"; }
  // Every element of a reduction's output is summed in one place, from every rank's input.
  bool sumsInFloat32() const override {
    return collective_ == Collective::AllReduce || collective_ == Collective::Reduce ||
           collective_ == Collective::ReduceScatter;
  }
  void launch(const CollectiveCall& call, const CollectiveContext& context, void*) const override {
    const CollectiveContext c = forCall(context, call);
    // A broadcast's non-root ranks may pass any send pointer; the kernel must never see it.
    const auto* send = call.usesSend() ? static_cast<const char*>(call.send) : nullptr;
    auto* recv = static_cast<char*>(call.recv);
    const bool chunked = call.collective == Collective::AllReduce || call.collective == Collective::Reduce ||
                         call.collective == Collective::Broadcast;
    const std::uint64_t perRank = call.bytes() / (chunked ? static_cast<std::uint64_t>(call.worldSize) : 1);
    const unsigned grid = gridFor(context, perRank, 32 << 10, 1, 64);
    switch (collective_) {
      case Collective::AllReduce:
      case Collective::Reduce: {
        const int root = collective_ == Collective::Reduce ? call.root : -1;
        dispatchAccumulation(call, [&]<class T, ReduceOp Op, bool Wide>() {
          launchCollective(context.earlyLaunch, allReduceDirect<T, Op, Wide>, grid, kThreads, call.stream, c,
                           published(call), send, recv, call.count, root);
        });
        break;
      }
      case Collective::ReduceScatter:
        dispatchAccumulation(call, [&]<class T, ReduceOp Op, bool Wide>() {
          launchCollective(context.earlyLaunch, reduceScatterDirect<T, Op, Wide>, grid, kThreads, call.stream, c,
                           published(call), send, recv, call.count);
        });
        break;
      case Collective::AllGather:
        launchCollective(context.earlyLaunch, moveDirect<Move::AllGather>, grid, kThreads, call.stream, c,
                         published(call), send, recv, call.count * call.elementBytes(), 0);
        break;
      case Collective::AllToAll:
        launchCollective(context.earlyLaunch, moveDirect<Move::AllToAll>, grid, kThreads, call.stream, c,
                         published(call), send, recv, call.count * call.elementBytes(), 0);
        break;
      case Collective::Broadcast:
        launchCollective(context.earlyLaunch, moveDirect<Move::Broadcast>, grid, kThreads, call.stream, c,
                         published(call), send, recv, call.count * call.elementBytes(), call.root);
        break;
    }
    checkLaunch(call, name_);
  }
  void preload() const override {
    switch (collective_) {
      case Collective::AllReduce:
      case Collective::Reduce:
        forEveryAccumulation(
            [&]<class T, ReduceOp Op, bool Wide>() { preloadKernel(allReduceDirect<T, Op, Wide>); });
        break;
      case Collective::ReduceScatter:
        forEveryAccumulation(
            [&]<class T, ReduceOp Op, bool Wide>() { preloadKernel(reduceScatterDirect<T, Op, Wide>); });
        break;
      case Collective::AllGather: preloadKernel(moveDirect<Move::AllGather>); break;
      case Collective::AllToAll: preloadKernel(moveDirect<Move::AllToAll>); break;
      case Collective::Broadcast: preloadKernel(moveDirect<Move::Broadcast>); break;
    }
  }

 private:
  const char* name_;
  Collective collective_;
};

}  // namespace

std::vector<const Algorithm*> directAlgorithms() {
  static const DirectAlgorithm all[] = {
      {"allreduce_direct", Collective::AllReduce},         {"allgather_direct", Collective::AllGather},
      {"reducescatter_direct", Collective::ReduceScatter}, {"alltoall_direct", Collective::AllToAll},
      {"broadcast_direct", Collective::Broadcast},         {"reduce_direct", Collective::Reduce}};
  std::vector<const Algorithm*> v;
  for (const auto& a : all) v.push_back(&a);
  return v;
}

}  // namespace ferry
