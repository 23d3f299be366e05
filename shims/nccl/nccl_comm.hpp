#pragma once
// ncclComm: what an ncclComm_t points to. It owns a ferry::Comm (native collectives) or, when ferry
// cannot run its ranks (they span hosts; FERRY_NCCL_FORWARD_ALL=1), a communicator of the real NCCL
// that every call on it is forwarded to. A non-blocking init (config->blocking = 0) runs on a
// thread of its own; calls on the comm wait for it to end.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "fallback.hpp"
#include "ferry/bootstrap.hpp"
#include "ferry/comm.hpp"
#include "nccl.h"

namespace ferry::nccl {

// A reduce op made by ncclRedOpCreatePreMulSum (ferry::PreMulSum for calls of its datatype).
struct PreMulSumOp {
  ncclDataType_t type;
  ncclScalarResidence_t residence;
  std::uint64_t hostScalar = 0;  // the scalar's bytes, when it lives on the host
  void* deviceScalar = nullptr;  // when it lives on the device
};

}  // namespace ferry::nccl

struct ncclComm {
  static constexpr std::uint64_t kAlive = 0x6665727279434f4dull;  // "ferryCOM"
  std::uint64_t magic = kAlive;

  int rank = 0, nranks = 1, device = 0;
  bool blocking = true;
  ferry::CommOptions options;  // from the config's minCTAs / maxCTAs
  // The config the comm was made with, for the real NCCL when it is forwarded (ferry::nccl::
  // forwardedConfig); netName's text is kept here, as the caller's may be gone by then.
  std::optional<ncclConfig_t> config;
  std::string netName;
  std::shared_ptr<ferry::TcpBootstrap> bootstrap;
  std::unique_ptr<ferry::Comm> comm;  // null when forwarded
  const ferry::nccl::RealNccl* forwardedTo = nullptr;
  ncclComm_t real = nullptr;  // the real NCCL's communicator, when forwarded

  // Init: Running until the thread (or the blocking call) finishes, then Ready or Failed.
  enum class State { Running, Ready, Failed, Aborted };
  std::atomic<State> state{State::Running};
  std::atomic<bool> deferred{false};  // its init waits for the outermost ncclGroupEnd
  std::atomic<bool> revoked{false};   // ncclCommRevoke: only destroy and shrink remain
  int shrinks = 0;                     // ncclCommShrink calls so far (their messages' bootstrap tags)
  ncclResult_t initResult = ncclSuccess;
  std::string initError;
  std::thread initThread;

  std::mutex mu;  // guards what follows
  std::map<std::uint64_t, ferry::BufferRegistration> registrations;  // by handle value
  std::map<int, ferry::nccl::PreMulSumOp> ops;                       // by op value
  int nextOp = ncclNumOps;
};

namespace ferry::nccl {

// The comm behind a handle, after its init has ended: ApiError for NULL, a destroyed or foreign
// pointer, a failed init (with its message), an aborted comm, or (unless `revokedToo`, as for
// ncclCommShrink) a revoked one.
ncclComm& usable(ncclComm_t comm, bool revokedToo = false);
// Runs (or, non-blocking, starts) the init of `c` through `create`, which makes the bootstrap on
// the current device; then a ferry::Comm, or the real NCCL's communicator when ferry cannot run
// the ranks (Comm::whyNot) or FERRY_NCCL_FORWARD_ALL=1. Returns what the caller returns:
// ncclInProgress while a non-blocking init runs.
ncclResult_t startInit(ncclComm* c, std::function<std::shared_ptr<TcpBootstrap>()> create);

}  // namespace ferry::nccl
