#include "ferry/env.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <variant>

#include "core/env_internal.hpp"
#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "core/text.hpp"

extern char** environ;

namespace ferry {
namespace {

using Seconds = std::chrono::duration<double>;
// The type of a variable follows from the Env field it fills: std::uint64_t fields are byte counts.
using Field =
    std::variant<std::string Env::*, bool Env::*, std::int64_t Env::*, Seconds Env::*, std::uint64_t Env::*>;

struct Var {
  const char* name;
  Field field;
  const char* defaultValue;
  const char* description;
};

// The table. Keep it sorted by subject; docs/env.md is generated from it (scripts/update-env-doc.sh).
const Var kVars[] = {
    {"FERRY_LOG", &Env::log, "WARN",
     "Log levels: LEVEL or LEVEL:subsystem items, comma-separated (e.g. INFO or WARN,TRACE:bootstrap). "
     "Levels NONE, ERROR, WARN, INFO, DEBUG, TRACE; subsystems core, bootstrap, transport, proxy, "
     "collectives, executor, nccl, tools."},
    {"FERRY_LOG_FILE", &Env::logFile, "",
     "Write log lines to this file instead of stderr; %h becomes the host name and %p the pid."},
    {"FERRY_BOOTSTRAP_TIMEOUT", &Env::bootstrapTimeout, "120",
     "Bound on every bootstrap operation (join, send/recv, allGather, barrier), in seconds."},
    {"FERRY_BOOTSTRAP_HANDSHAKE_TIMEOUT", &Env::handshakeTimeout, "10",
     "Time a new connection has to complete its authenticated handshake before it is dropped, and the bound "
     "on connecting to a peer, in seconds."},
    {"FERRY_BOOTSTRAP_MAX_MESSAGE", &Env::bootstrapMaxMessage, "1G",
     "Largest bootstrap message accepted from a peer; a larger one fails the receiving call."},
    {"FERRY_BOOTSTRAP_SECRET", &Env::bootstrapSecret, "",
     "Shared secret that authenticates ranks joining by host:port or torchrun variables (a UniqueId "
     "carries a random secret of its own)."},
    {"FERRY_BOOTSTRAP_PORT", &Env::bootstrapPort, "-1",
     "Root port for TcpBootstrap::fromEnvironment; -1 means MASTER_PORT + 1."},
    {"FERRY_SOCKET_IFNAME", &Env::socketIfname, "",
     "Network interfaces for the bootstrap: comma-separated name prefixes, ^ to exclude, = for an exact "
     "name (e.g. eth,ib or ^docker,lo or =eth0). Unset: the route to the root, or the first non-loopback "
     "interface."},
    {"FERRY_SOCKET_FAMILY", &Env::socketFamily, "",
     "Address family for the bootstrap: AF_INET or AF_INET6; unset: either."},
    {"FERRY_HOSTID", &Env::hostId, "",
     "Overrides the host identity (hostname and boot id) that decides which ranks share a host."},
    {"FERRY_FD_TIMEOUT", &Env::fdTimeout, "10",
     "Bound on fetching a peer's allocation file descriptor over its Unix-domain socket when mapping "
     "its registered memory, in seconds."},
    {"FERRY_CONNECTION_TIMEOUT", &Env::connectionTimeout, "60",
     "Bound on a connection's waits (Connection::flush() without an argument, a free staging slot for "
     "updateAndSync), in seconds."},
    {"FERRY_ETHERNET_LANES", &Env::ethernetLanes, "1",
     "TCP streams per Ethernet connection (1 to 16; the smaller of the two sides' values applies). Writes "
     "of host memory into host memory from 1 MiB up are cut across them, so that several flows and "
     "receiver threads carry one write; device memory and signals stay on the first."},
    {"FERRY_CHECK_POINTERS", &Env::checkPointers, "cached",
     "How a call checks that its buffers are device memory of the Comm's GPU: cached (CUDA is asked the "
     "first time an allocation is seen, its range then remembered), always (asked on every call, as "
     "NCCL_CHECK_POINTERS=1) or never (only null, alignment and overlap are checked)."},
    {"FERRY_DEVICE_TIMEOUT", &Env::deviceTimeout, "30",
     "Bound on every device-side wait (FIFO push and sync, semaphore and channel waits), in seconds; on "
     "expiry the kernel reports rank, peer and operation and traps. 0: never time out (debugging only)."},
    {"FERRY_MULTI_HOST", &Env::multiHost, "0",
     "1: a Comm whose ranks span hosts runs natively (experimental): the six collectives with the "
     "built-in ops and PreMulSum on hosts of any sizes, send and recv, at most 8 hosts of at most 8 ranks, a "
     "TcpBootstrap; its ranks of a host share NVLink, its partners across hosts Ethernet "
     "(docs/multi-node.md). 0: such a Comm is refused, and the NCCL library and the torch backend hand "
     "it to NCCL."},
    {"FERRY_PHASE_STAMPS", &Env::phaseStamps, "0",
     "1: every collective kernel records when it passes each phase (start word stored, peers started, "
     "data moved, call ended) for its last 65536 calls, and each Comm prints the medians per "
     "collective and count to stderr when it is destroyed (the send/recv kernel's too, in rows of "
     "their own). For finding where a call's time goes."},
    {"FERRY_LAUNCH_PDL", &Env::launchPdl, "1",
     "1: collective kernels are launched with programmatic dependent launch (compute capability 9.0 and "
     "later): a call's blocks reach their SMs while the kernel before it on the stream still runs and "
     "start the moment it ends, in CUDA graphs too; 0.3-0.8 us less per call up to 64 KiB. 0: plain "
     "stream order, for ruling it out when a kernel of another library misbehaves beside ferry's "
     "(docs/architecture.md, \"Latency\")."},
    {"FERRY_ACCUMULATION", &Env::accumulation, "stepwise",
     "How a sum or average of 16- and 8-bit floats adds up the ranks' terms in a call that does not "
     "choose (the Comm calls without an Accumulation, the NCCL API, the torch backend, ferry.Comm "
     "without accumulation=): stepwise (rounded to the type after each rank, as NCCL does) or float32 "
     "(added in float32 in rank order, rounded once, on the algorithms that reduce every element in one "
     "place: docs/architecture.md, \"Accumulation\"). A Comm across hosts, and a PreMulSum, sum "
     "stepwise. Every rank must set the same."},
    {"FERRY_ALGO", &Env::algo, "",
     "Forces collective algorithms: NAME[,NAME...] or COLLECTIVE=NAME,... (e.g. allreduce=allreduce_ll); "
     "names as `ferry-bench --list` prints them. A forced algorithm that cannot run a call fails it."},
    {"FERRY_TUNING_FILE", &Env::tuningFile, "",
     "JSON tuning table (written by `ferry-bench --tune`) consulted before the built-in defaults when "
     "choosing a collective algorithm."},
    {"FERRY_PLAN_DIR", &Env::planDir, "",
     "Collective plans (docs/plan-format.md) to load as algorithms named plan:NAME: a plan file, or a "
     "directory whose *.json files are plans; several separated by ':'. A plan runs the calls of its "
     "collective, world size and size range, ahead of the tuning table."},
    {"FERRY_PLAN_LANES", &Env::planLanes, "64",
     "Most thread blocks that run each thread block of a plan, each on its own part of every chunk (one "
     "per 256 KiB of the call, 8 KiB for LL plans, at most 64); 1 runs plans as written. The smallest "
     "value of any rank applies."},
    {"FERRY_PLAN_FUSE", &Env::planFuse, "1",
     "1: runs of a plan's ops that one op can do run as one (put_packets of one source to several peers; "
     "a copy then reduce_packets into its destination: docs/executor.md, \"Fused ops\"); 0: every op as "
     "written (to compare, or to rule the fused ops out)."},
    {"FERRY_PLAN_PORTS", &Env::planPorts, "memory",
     "How a plan's port channels move data between the GPUs of one host: memory (the thread blocks' own "
     "stores over NVLink, as on a memory channel, in lanes; the signals and waits are the same) or proxy "
     "(the Comm's host proxy and the copy engine, one lane, as written). memory applies when every rank "
     "asks for it and no rank's Comm was given its own connections (CommOptions::connect)."},
    {"FERRY_PARTNER_NET", &Env::partnerNet, "auto",
     "What carries a Comm across hosts' cross-host phase (docs/multi-node.md): ferry (its own "
     "PortChannels on Ethernet connections), nccl (NVIDIA's NCCL, FERRY_NCCL_FALLBACK, with its "
     "InfiniBand, RoCE or socket transports), sized (both: exchanges of up to FERRY_PARTNER_NCCL_BYTES "
     "on nccl, larger ones on ferry) or auto (nccl where every rank sees an InfiniBand or RoCE device "
     "and can open NCCL, ferry elsewhere). Every rank must ask for the same (auto aside)."},
    {"FERRY_PARTNER_NCCL_BYTES", &Env::partnerNcclBytes, "128K",
     "With FERRY_PARTNER_NET=sized: the largest part a partner exchange sends each host on NCCL's "
     "network; larger parts go on ferry's connections (the largest value of any rank applies)."},
    {"FERRY_ACROSS_HOSTS_PIECE", &Env::acrossHostsPiece, "16M",
     "The size of a piece of the pipelined allReduce across hosts (docs/multi-node.md): the host's "
     "reduceScatter and allGather of one piece run while the partners exchange the piece before it "
     "(at most 64 pieces a call; the largest value of any rank applies)."},
    {"FERRY_PARTNER_SCRATCH", &Env::partnerScratch, "device",
     "Where a Comm across hosts receives its partners' parts (docs/multi-node.md): device (GPU memory: "
     "the connection's receiver copies each chunk in through page-locked buffers) or host (page-locked "
     "host memory the GPU maps: the receiver writes it straight from the socket, the kernel reads it "
     "over PCIe; experimental, not yet timed)."},
    {"FERRY_SCRATCH_BYTES", &Env::scratchBytes, "128M",
     "Scratch memory per rank that peers write into for Simple-protocol collectives (two halves); "
     "larger calls run in rounds."},
    {"FERRY_LL_BYTES", &Env::llBytes, "1M",
     "Data one peer's LL packet slot can carry per call; LL algorithms take calls up to this size. "
     "Each rank holds 2 * 2 * world size times this much packet memory."},
    {"FERRY_NCCL_FALLBACK", &Env::ncclFallback, "libnccl.so.2",
     "The real NCCL that libferry_nccl forwards the calls ferry does not run natively to, and that "
     "carries a Comm across hosts' cross-host phase with FERRY_PARTNER_NET=nccl (loaded with dlopen, its "
     "symbols kept apart from ferry's); empty: forward nothing, such calls fail."},
    {"FERRY_NCCL_FORWARD_ALL", &Env::ncclForwardAll, "0",
     "1: every communicator of libferry_nccl runs on the real NCCL (FERRY_NCCL_FALLBACK), as those whose "
     "ranks span hosts always do; to compare with NCCL without unloading ferry."},
    {"FERRY_ENABLE_NVLS", &Env::enableNvls, "0",
     "Allow NVLink multicast (SwitchChannel, NVLS algorithms). Never set it on shared machines."},
    {"NCCL_NVLS_ENABLE", &Env::ncclNvlsEnable, "",
     "Honoured as NCCL does: 0 turns NVLink multicast off even when FERRY_ENABLE_NVLS=1."},
    {"TORCH_SYMM_MEM_DISABLE_MULTICAST", &Env::torchSymmMemDisableMulticast, "0",
     "Honoured as PyTorch does: 1 turns NVLink multicast off even when FERRY_ENABLE_NVLS=1."},
    {"MASTER_ADDR", &Env::masterAddr, "", "torchrun: host of rank 0, for TcpBootstrap::fromEnvironment."},
    {"MASTER_PORT", &Env::masterPort, "-1", "torchrun: port of torchrun's store on MASTER_ADDR."},
    {"RANK", &Env::rank, "-1", "torchrun: this process's rank."},
    {"WORLD_SIZE", &Env::worldSize, "-1", "torchrun: number of ranks."},
    {"LOCAL_RANK", &Env::localRank, "-1",
     "torchrun: rank on this host; checked against what the bootstrap finds."},
    {"TORCHELASTIC_RUN_ID", &Env::torchelasticRunId, "",
     "torchrun: job id, mixed into the join secret of TcpBootstrap::fromEnvironment."},
};

// Variables that the Python package reads, not this library (python/ferry/torch and its extension
// python/torch_backend): listed here so that docs/env.md has every variable and the startup log does
// not take them for typos. Their values are checked where they are read.
struct PackageVar {
  const char* name;
  const char* type;
  const char* defaultValue;
  const char* description;
};

const PackageVar kPackageVars[] = {
    {"FERRY_TORCH_FORWARD", "Bool", "1",
     "ferry.torch: a group the ferry backend cannot run natively (its ranks span hosts) is handed to "
     "PyTorch's NCCL backend, logged on its rank 0; 0 makes that an error instead."},
    {"FERRY_FUSED_PIPELINE", "String", "",
     "torch.ops.ferry.fused_*: 1 runs every call it can pipelined on symmetric memory, 0 none; unset, the "
     "size table picks (docs/fused.md)."},
    {"FERRY_FUSED_COPY_BLOCKS", "Int", "0",
     "torch.ops.ferry.fused_*, pipelined on a ferry group: 0 moves the chunks by the copy engines, N in "
     "[1, 1024] by SM stores on N thread blocks beside the matmul (docs/fused.md)."},
    {"FERRY_FUSED_REGISTERED", "Bool", "0",
     "torch.ops.ferry.fused_*: 1 runs the composition's collectives on registered workspaces of the group "
     "(zero-copy; docs/fused.md)."},
};

[[noreturn]] void bad(const char* name, const std::string& value, const char* expected) {
  throw Error(ErrorCode::InvalidUsage, std::string(name) + "='" + value + "' is not valid: expected " +
                                           expected + " (see docs/env.md)");
}

bool parseBool(const char* name, const std::string& raw) {
  std::string v = trim(raw);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off" || v.empty()) return false;
  bad(name, raw, "a boolean (1/0, true/false, yes/no, on/off)");
}

std::int64_t parseInt(const char* name, const std::string& raw) {
  std::string v = trim(raw);
  if (v.empty()) bad(name, raw, "an integer");
  errno = 0;
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') bad(name, raw, "an integer");
  return n;
}

Seconds parseSeconds(const char* name, const std::string& raw) {
  std::string v = trim(raw);
  double scale = 1.0;
  if (v.size() > 2 && v.ends_with("ms")) {
    scale = 1e-3;
    v.resize(v.size() - 2);
  } else if (v.size() > 1 && v.back() == 's') {
    v.pop_back();
  }
  errno = 0;
  char* end = nullptr;
  double d = v.empty() ? -1 : std::strtod(v.c_str(), &end);
  if (v.empty() || errno != 0 || *end != '\0' || !std::isfinite(d) || d < 0)
    bad(name, raw, "a non-negative number of seconds (e.g. 120, 0.5 or 250ms)");
  return Seconds(d * scale);
}

std::uint64_t parseBytes(const char* name, const std::string& raw) {
  std::string v = trim(raw);
  std::uint64_t scale = 1;
  if (!v.empty()) {
    switch (std::toupper(static_cast<unsigned char>(v.back()))) {
      case 'K': scale = 1ull << 10; break;
      case 'M': scale = 1ull << 20; break;
      case 'G': scale = 1ull << 30; break;
      case 'T': scale = 1ull << 40; break;
      default: break;
    }
    if (scale != 1) v.pop_back();
  }
  errno = 0;
  char* end = nullptr;
  unsigned long long n = v.empty() || v[0] == '-' ? 0 : std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || errno != 0 || *end != '\0' || n > UINT64_MAX / scale)
    bad(name, raw, "a byte count, optionally with a K, M, G or T suffix (binary units)");
  return n * scale;
}

const char* typeName(const Field& f) {
  constexpr const char* names[] = {"String", "Bool", "Int", "Seconds", "Bytes"};
  return names[f.index()];
}

void assign(Env& e, const Var& var, const std::string& value) {
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(e.*member)>;
        if constexpr (std::is_same_v<T, std::string>)
          e.*member = value;
        else if constexpr (std::is_same_v<T, bool>)
          e.*member = parseBool(var.name, value);
        else if constexpr (std::is_same_v<T, std::int64_t>)
          e.*member = parseInt(var.name, value);
        else if constexpr (std::is_same_v<T, Seconds>)
          e.*member = parseSeconds(var.name, value);
        else
          e.*member = parseBytes(var.name, value);
      },
      var.field);
}

}  // namespace

Env Env::parse(const std::function<const char*(const char*)>& lookup) {
  Env e{};
  for (const Var& var : kVars) {
    const char* set = lookup(var.name);
    assign(e, var, set != nullptr ? std::string(set) : std::string(var.defaultValue));
  }
  if (e.checkPointers != "cached" && e.checkPointers != "always" && e.checkPointers != "never")
    bad("FERRY_CHECK_POINTERS", e.checkPointers, "cached, always or never");
  if (e.planPorts != "proxy" && e.planPorts != "memory") bad("FERRY_PLAN_PORTS", e.planPorts, "proxy or memory");
  if (e.accumulation != "stepwise" && e.accumulation != "float32")
    bad("FERRY_ACCUMULATION", e.accumulation, "stepwise or float32");
  if (e.partnerNet != "auto" && e.partnerNet != "ferry" && e.partnerNet != "nccl" && e.partnerNet != "sized")
    bad("FERRY_PARTNER_NET", e.partnerNet, "auto, ferry, nccl or sized");
  if (e.partnerScratch != "device" && e.partnerScratch != "host")
    bad("FERRY_PARTNER_SCRATCH", e.partnerScratch, "device or host");
  if (!e.socketFamily.empty() && e.socketFamily != "AF_INET" && e.socketFamily != "AF_INET6")
    bad("FERRY_SOCKET_FAMILY", e.socketFamily, "AF_INET or AF_INET6");
  return e;
}

const Env& detail::parsedEnv() {
  static const Env parsed = Env::parse([](const char* name) { return std::getenv(name); });
  return parsed;
}

const Env& env() {
  const Env& parsed = detail::parsedEnv();
  // Once: the startup lines, with their warning for misspelt variables. (The logger reads the
  // environment through parsedEnv, so that its own first use does not come back here.)
  static std::atomic<bool> announced{false};
  if (!announced.load(std::memory_order_acquire) && !announced.exchange(true)) log::announceStartup();
  return parsed;
}

std::span<const EnvVarInfo> envTable() {
  static const std::vector<EnvVarInfo> table = [] {
    std::vector<EnvVarInfo> out;
    for (const Var& var : kVars)
      out.push_back({var.name, typeName(var.field), var.defaultValue, var.description});
    return out;
  }();
  return table;
}

std::string envMarkdown() {
  std::string md =
      "# Environment variables\n\n"
      "Generated from the table in src/core/env.cpp by scripts/update-env-doc.sh; do not edit by hand.\n"
      "A malformed value is an error at first use that names the variable.\n\n"
      "| name | type | default | description |\n| --- | --- | --- | --- |\n";
  auto row = [&](const char* name, const char* type, const char* defaultValue, const char* description) {
    std::string def = *defaultValue ? std::string("`") + defaultValue + "`" : std::string("(unset)");
    md += std::string("| `") + name + "` | " + type + " | " + def + " | " + description + " |\n";
  };
  for (const EnvVarInfo& v : envTable()) row(v.name, v.type, v.defaultValue, v.description);
  md += "\n## Read by the Python package\n\n"
        "`ferry.torch` and its torch extension read these; the library does not.\n\n"
        "| name | type | default | description |\n| --- | --- | --- | --- |\n";
  for (const PackageVar& v : kPackageVars) row(v.name, v.type, v.defaultValue, v.description);
  return md;
}

bool nvlsAllowed(const Env& e) {
  if (!e.enableNvls) return false;
  if (trim(e.ncclNvlsEnable) == "0") return false;
  return !e.torchSymmMemDisableMulticast;
}

namespace detail {

std::vector<std::pair<std::string, std::string>> envSetVariables() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Var& var : kVars)
    if (const char* v = std::getenv(var.name); v != nullptr) out.emplace_back(var.name, v);
  return out;
}

std::vector<std::string> envUnknownFerryVariables() {
  // The tools' and tests' own variables, not the library's (tools/common/launcher.cpp, the tests;
  // FERRY_REQUIRE_NATIVE/GPU: the Python tests').
  constexpr std::string_view kNotOurs[] = {"FERRY_BENCH_", "FERRY_TEST_", "FERRY_FUZZ_", "FERRY_PLAN_COUNT=",
                                           "FERRY_REQUIRE_"};
  std::vector<std::string> out;
  for (char** p = environ; p != nullptr && *p != nullptr; ++p) {
    std::string_view entry(*p);
    if (!entry.starts_with("FERRY_")) continue;
    if (std::any_of(std::begin(kNotOurs), std::end(kNotOurs), [&](std::string_view n) { return entry.starts_with(n); }))
      continue;
    std::string name(entry.substr(0, entry.find('=')));
    bool known =
        std::any_of(std::begin(kVars), std::end(kVars), [&](const Var& v) { return name == v.name; }) ||
        std::any_of(std::begin(kPackageVars), std::end(kPackageVars),
                    [&](const PackageVar& v) { return name == v.name; });
    if (!known) out.push_back(name);
  }
  return out;
}

}  // namespace detail
}  // namespace ferry
