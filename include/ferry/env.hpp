#pragma once
// Every environment variable ferry reads is defined once, in the table in src/core/env.cpp: its
// name, type, default and a one-line description. The parser, the startup log of variables that
// are set, `ferry-info --env-markdown` and docs/env.md all come from that table.
//
// env() parses the process environment once, on first use; a malformed value throws
// Error(InvalidUsage) naming the variable, the value and what was expected.
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "ferry/api.hpp"

namespace ferry {

struct FERRY_API Env {
  std::string log;                                 // FERRY_LOG
  std::string logFile;                             // FERRY_LOG_FILE
  std::chrono::duration<double> bootstrapTimeout;  // FERRY_BOOTSTRAP_TIMEOUT
  std::chrono::duration<double> handshakeTimeout;  // FERRY_BOOTSTRAP_HANDSHAKE_TIMEOUT
  std::uint64_t bootstrapMaxMessage;               // FERRY_BOOTSTRAP_MAX_MESSAGE
  std::string bootstrapSecret;                     // FERRY_BOOTSTRAP_SECRET
  std::int64_t bootstrapPort;                      // FERRY_BOOTSTRAP_PORT
  std::string socketIfname;                        // FERRY_SOCKET_IFNAME
  std::string socketFamily;                        // FERRY_SOCKET_FAMILY
  std::string hostId;                              // FERRY_HOSTID
  std::chrono::duration<double> deviceTimeout;     // FERRY_DEVICE_TIMEOUT
  std::chrono::duration<double> fdTimeout;         // FERRY_FD_TIMEOUT
  std::chrono::duration<double> connectionTimeout; // FERRY_CONNECTION_TIMEOUT
  std::int64_t ethernetLanes;                      // FERRY_ETHERNET_LANES
  bool multiHost;                                  // FERRY_MULTI_HOST
  std::string checkPointers;                       // FERRY_CHECK_POINTERS
  bool phaseStamps;                                // FERRY_PHASE_STAMPS
  bool launchPdl;                                  // FERRY_LAUNCH_PDL
  std::string accumulation;                        // FERRY_ACCUMULATION
  std::string algo;                                // FERRY_ALGO
  std::string tuningFile;                          // FERRY_TUNING_FILE
  std::string planDir;                             // FERRY_PLAN_DIR
  std::int64_t planLanes;                          // FERRY_PLAN_LANES
  bool planFuse;                                   // FERRY_PLAN_FUSE
  std::string planPorts;                           // FERRY_PLAN_PORTS
  std::string partnerScratch;                      // FERRY_PARTNER_SCRATCH
  std::string partnerNet;                          // FERRY_PARTNER_NET
  std::uint64_t partnerNcclBytes;                  // FERRY_PARTNER_NCCL_BYTES
  std::uint64_t acrossHostsPiece;                  // FERRY_ACROSS_HOSTS_PIECE
  std::uint64_t scratchBytes;                      // FERRY_SCRATCH_BYTES
  std::uint64_t llBytes;                           // FERRY_LL_BYTES
  std::string ncclFallback;                        // FERRY_NCCL_FALLBACK
  bool ncclForwardAll;                             // FERRY_NCCL_FORWARD_ALL
  bool enableNvls;                                 // FERRY_ENABLE_NVLS
  std::string ncclNvlsEnable;                      // NCCL_NVLS_ENABLE
  bool torchSymmMemDisableMulticast;               // TORCH_SYMM_MEM_DISABLE_MULTICAST
  std::string masterAddr;                          // MASTER_ADDR
  std::int64_t masterPort;                         // MASTER_PORT
  std::int64_t rank;                               // RANK
  std::int64_t worldSize;                          // WORLD_SIZE
  std::int64_t localRank;                          // LOCAL_RANK
  std::string torchelasticRunId;                   // TORCHELASTIC_RUN_ID

  // Parses the variables through `lookup` (nullptr: unset). Tests pass a map; env() passes getenv.
  static Env parse(const std::function<const char*(const char*)>& lookup);
};

// The process environment, parsed on first use.
FERRY_API const Env& env();

struct EnvVarInfo {
  const char* name;
  const char* type;  // Bool, Int, Seconds, Bytes or String
  const char* defaultValue;
  const char* description;
};
FERRY_API std::span<const EnvVarInfo> envTable();
// The table as the Markdown page docs/env.md.
FERRY_API std::string envMarkdown();

// NVLink multicast (NVLS) may run only when FERRY_ENABLE_NVLS=1 and neither NCCL_NVLS_ENABLE=0 nor
// TORCH_SYMM_MEM_DISABLE_MULTICAST=1 is set (architecture.md rule 1). Every code path that could create a
// multicast object asks this first.
FERRY_API bool nvlsAllowed(const Env& e = env());

}  // namespace ferry
