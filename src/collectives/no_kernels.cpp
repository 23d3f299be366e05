// A build without CUDA (FERRY_BUILD_CUDA=OFF) has no collective kernels: every collective then has
// no algorithm, and a Comm call says so; so does a send or recv to another rank.
#include "collectives/builtin.hpp"
#include "collectives/p2p.hpp"
#include "collectives/partner_exchange.hpp"
#include "collectives/premul_sum.hpp"
#include "ferry/errors.hpp"

namespace ferry {

std::vector<const Algorithm*> allReduceAlgorithms() { return {}; }
std::vector<const Algorithm*> allGatherAlgorithms() { return {}; }
std::vector<const Algorithm*> reduceScatterAlgorithms() { return {}; }
std::vector<const Algorithm*> allToAllAlgorithms() { return {}; }
std::vector<const Algorithm*> broadcastAlgorithms() { return {}; }
std::vector<const Algorithm*> reduceAlgorithms() { return {}; }
std::vector<const Algorithm*> directAlgorithms() { return {}; }
std::vector<const Algorithm*> copyEngineAlgorithms() { return {}; }

void preloadP2P() {}

void preloadPreMul() {}

void launchPreMul(void*, const void*, std::size_t, DataType, const PreMulSum&, int, cudaStream_t) {
  throw Error(ErrorCode::NotSupported, "PreMulSum: this build of ferry has no CUDA kernels");
}

int p2pResidentBlocks() { return 1 << 30; }  // launchP2P says what is missing

void launchP2P(const P2PBatch&, const P2PContext& context, cudaStream_t, bool) {
  throw Error(ErrorCode::NotSupported,
              "rank " + std::to_string(context.rank) + ": send/recv: this build of ferry has no CUDA kernels");
}

void preloadPartnerExchange() {}

void launchPartnerExchange(const PartnerChannels*, std::uint64_t, const PartnerExchange&, DataType, ReduceOp,
                           cudaStream_t) {
  throw Error(ErrorCode::NotSupported, "partners' exchange: this build of ferry has no CUDA kernels");
}

void launchPartnerReduce(char*, const char* const*, int, std::uint64_t, DataType, ReduceOp, int, cudaStream_t) {
  throw Error(ErrorCode::NotSupported, "partners' reduce: this build of ferry has no CUDA kernels");
}

}  // namespace ferry
