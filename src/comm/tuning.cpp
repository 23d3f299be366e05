// The tuning table: built-in defaults and the JSON file format (selector.hpp).
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "collectives/partner_exchange.hpp"
#include "comm/across_hosts_algorithms.hpp"
#include "comm/selector.hpp"
#include "ferry/errors.hpp"

namespace ferry {

std::vector<TuningRow> defaultTuning() {
  constexpr std::uint64_t KiB = 1024, MiB = 1024 * KiB, any = ~0ull;
  // Two ranks: ferry-bench --tune on 2 H200 (NVSwitch), bf16, 2026-11-24. LL packets to 1 MiB where
  // they won there (LL reads the user's buffers as they are, so those rows hold registered or not);
  // on registered buffers, each size's fastest. Zero-copy lost to the scratch kernels on some ranges:
  // at 1 GiB, allreduce_direct took 3434 us and allreduce_two_shot 3147 us.
  const std::optional<DataType> anyType;
  const auto registered = [&](Collective c, std::uint64_t maxBytes, const char* algorithm) {
    return TuningRow{c, 2, maxBytes, algorithm, anyType, true};
  };
  // Unregistered, above LL: send/recv groups (p2p_collectives.hpp) beat the push kernels on 2 H100,
  // 2026-11-26 (docs/measurements/h100x2-2026-11-26-issue19-23-same-call.md): at 64 MiB 108 us
  // against 137 (allgather and alltoall), 1 GiB 1560 against 1721-1727; broadcast 16.3 / 53.2 us
  // against 17.5 / 56.8 at 4 / 16 MiB, within 1% of it either way from 64 MiB. An in-place
  // all-to-all falls through to the general rows (alltoall_push).
  const auto unregistered = [&](Collective c, const char* algorithm) {
    return TuningRow{c, 2, any, algorithm, anyType, false};
  };
  std::vector<TuningRow> rows = {
      {Collective::AllReduce, 2, 1 * MiB, "allreduce_ll"},
      registered(Collective::AllReduce, any, "allreduce_two_shot"),
      {Collective::AllGather, 2, 1 * MiB, "allgather_ll"},
      registered(Collective::AllGather, 4 * MiB, "allgather_push"),
      registered(Collective::AllGather, 64 * MiB, "allgather_direct"),
      registered(Collective::AllGather, any, "allgather_ce"),
      registered(Collective::ReduceScatter, 4 * MiB, "reducescatter_push"),
      {Collective::AllToAll, 2, 1 * MiB, "alltoall_ll"},
      registered(Collective::AllToAll, 4 * MiB, "alltoall_push"),
      registered(Collective::AllToAll, 16 * MiB, "alltoall_direct"),
      registered(Collective::AllToAll, any, "alltoall_ce"),
      registered(Collective::Broadcast, 4 * MiB, "broadcast_push"),
      registered(Collective::Broadcast, 16 * MiB, "broadcast_direct"),
      registered(Collective::Broadcast, 64 * MiB, "broadcast_push"),
      {Collective::Reduce, 2, 1 * MiB, "reduce_ll"},
      registered(Collective::Reduce, 4 * MiB, "reduce_direct"),
      registered(Collective::Reduce, any, "reduce_two_shot"),
      unregistered(Collective::AllGather, "allgather_p2p"),
      unregistered(Collective::AllToAll, "alltoall_p2p"),
      unregistered(Collective::Broadcast, "broadcast_p2p"),
      // 2 H100, 2026-11-28 (docs/measurements/h100x2-2026-11-28-fd17eb7-wave-pipelined.md):
      // reduce_chain 764 us at 256 MiB and 2994 at 1 GiB against reduce_two_shot's 778 and 3068;
      // behind at 16 and 64 MiB (118 / 260 against 57 / 201).
      {Collective::Reduce, 2, 128 * MiB, "reduce_two_shot", anyType, false},
      unregistered(Collective::Reduce, "reduce_chain"),
  };
  // Four ranks: ferry-bench broadcast, bf16, 2026-11-26. Unregistered, on 4 H200 (NVSwitch):
  // broadcast_push is bound by the root's links (120 GB/s at 1 GiB); broadcast_scatter sends each
  // byte over each link once and took 38 us at 4 MiB (push 41) and 3610 us at 1 GiB (push 8969);
  // at 1 MiB push took 14 us and scatter 29. Registered, on 4 H100: broadcast_direct took 27 us at
  // 4 MiB (scatter 40) and 83 at 16 MiB (87); at 64 MiB scatter took 268 (direct 298), at 1 GiB
  // 3599 (4548).
  //
  // The pipelines of collectives/chain.cu, forced beside the default choice and NCCL on 4 H200, bf16,
  // unregistered, 2026-11-27 (docs/measurements/h200x4-2026-11-27-candidates-plans.md); rows for
  // unregistered buffers only, where they ran, from where they won (between two measured sizes the
  // cut lies halfway, in powers of two):
  // - reduce_chain: 276 us at 64 MiB (reduce_two_shot 313), 798 at 256 MiB (1171), 3234 at 1 GiB
  //   (4679; NCCL 2961); behind at 4 and 16 MiB (54 / 131 against 32 / 92), where a piece's
  //   hand-over costs more than its bytes;
  // - broadcast_chain: 267 us at 64 MiB (broadcast_scatter 272), 811 at 256 MiB (981), 3234 at
  //   1 GiB (3653; NCCL 2988); behind at 16 MiB (130 against 85);
  // - reducescatter_ring: 2406 us at 1 GiB (reducescatter_push 2838; NCCL 2488), behind at 256 MiB
  //   (930 against 767);
  // - allreduce_ring_pipelined: 4761 us at 1 GiB (allreduce_two_shot 4903; NCCL 4516), behind at
  //   256 MiB (1691 against 1230).
  const std::vector<TuningRow> four = {
      {Collective::Broadcast, 4, 256 * KiB, "broadcast_ll"},
      {Collective::Broadcast, 4, 1 * MiB, "broadcast_push", anyType, false},
      {Collective::Broadcast, 4, 16 * MiB, "broadcast_direct", anyType, true},
      {Collective::Broadcast, 4, 32 * MiB, "broadcast_scatter"},
      {Collective::Broadcast, 4, any, "broadcast_chain", anyType, false},
      {Collective::Broadcast, 4, any, "broadcast_scatter"},
      {Collective::Reduce, 4, 256 * KiB, "reduce_ll"},
      {Collective::Reduce, 4, 32 * MiB, "reduce_two_shot", anyType, false},
      {Collective::Reduce, 4, any, "reduce_chain", anyType, false},
      {Collective::ReduceScatter, 4, 256 * KiB, "reducescatter_ll"},
      {Collective::ReduceScatter, 4, 512 * MiB, "reducescatter_push", anyType, false},
      {Collective::ReduceScatter, 4, any, "reducescatter_ring", anyType, false},
      {Collective::AllReduce, 4, 256 * KiB, "allreduce_ll"},
      {Collective::AllReduce, 4, 512 * MiB, "allreduce_two_shot", anyType, false},
      {Collective::AllReduce, 4, any, "allreduce_ring_pipelined", anyType, false},
  };
  rows.insert(rows.end(), four.begin(), four.end());
  // Any world size: LL packets while latency dominates; then zero-copy on registered buffers, and
  // the Simple protocol through scratch on the others.
  const std::vector<TuningRow> general = {
      {Collective::AllReduce, 0, 256 * KiB, "allreduce_ll"},
      {Collective::AllReduce, 0, ~0ull, "allreduce_direct"},
      {Collective::AllReduce, 0, ~0ull, "allreduce_two_shot"},
      {Collective::AllGather, 0, 256 * KiB, "allgather_ll"},
      {Collective::AllGather, 0, ~0ull, "allgather_direct"},
      {Collective::AllGather, 0, ~0ull, "allgather_push"},
      {Collective::ReduceScatter, 0, 256 * KiB, "reducescatter_ll"},
      {Collective::ReduceScatter, 0, ~0ull, "reducescatter_direct"},
      {Collective::ReduceScatter, 0, ~0ull, "reducescatter_push"},
      {Collective::AllToAll, 0, 256 * KiB, "alltoall_ll"},
      {Collective::AllToAll, 0, ~0ull, "alltoall_direct"},
      {Collective::AllToAll, 0, ~0ull, "alltoall_push"},
      {Collective::Broadcast, 0, 256 * KiB, "broadcast_ll"},
      {Collective::Broadcast, 0, ~0ull, "broadcast_direct"},
      {Collective::Broadcast, 0, ~0ull, "broadcast_push"},
      {Collective::Reduce, 0, 256 * KiB, "reduce_ll"},
      {Collective::Reduce, 0, ~0ull, "reduce_direct"},
      {Collective::Reduce, 0, ~0ull, "reduce_two_shot"},
  };
  rows.insert(rows.end(), general.begin(), general.end());
  // Across hosts, any number of hosts and ranks a host: the pipelined allReduce wherever it runs
  // (across_hosts_algorithms.hpp), phases elsewhere. On 2 hosts x 2 H100 over TCP on loopback, bf16,
  // 2026-11-27 (docs/measurements/h100x4-2026-11-27-across-hosts-pipelined.md), in 16 MiB pieces it
  // was within the runs' spread of phases from 1 MiB to 64 MiB and 7% faster at 256 MiB (56.2 ms
  // against 60.6); in 4 MiB pieces, 4-12% slower at 64 and 256 MiB (an exchange's fixed costs).
  TuningRow pipelined{Collective::AllReduce, 0, any, "across_hosts_pipelined"};
  pipelined.hosts = 0;
  rows.push_back(pipelined);
  return rows;
}

std::vector<TuningRow> parseTuning(std::string_view text, std::string_view source) {
  auto fail = [&](const std::string& where, const std::string& what) -> Error {
    return Error(ErrorCode::InvalidUsage,
                 "tuning table " + std::string(source) + ": " + where + ": " + what +
                     " (expected {\"version\": 1, \"rows\": [{\"collective\": ..., \"world_size\": ..., "
                     "\"max_bytes\": ..., \"algorithm\": ...}]})");
  };
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw fail("document", std::string("not JSON: ") + e.what());
  }
  if (!doc.is_object()) throw fail("document", "not an object");
  if (!doc.contains("version") || doc["version"] != 1) throw fail("version", "must be 1");
  if (!doc.contains("rows") || !doc["rows"].is_array()) throw fail("rows", "missing or not an array");
  std::vector<TuningRow> rows;
  for (std::size_t i = 0; i < doc["rows"].size(); ++i) {
    const auto& r = doc["rows"][i];
    const std::string where = "rows[" + std::to_string(i) + "]";
    if (!r.is_object()) throw fail(where, "not an object");
    TuningRow row;
    if (!r.contains("collective") || !r["collective"].is_string()) throw fail(where + ".collective", "missing");
    auto c = parseCollective(r["collective"].get<std::string>());
    if (!c) throw fail(where + ".collective", "unknown collective '" + r["collective"].get<std::string>() + "'");
    row.collective = *c;
    if (r.contains("world_size")) {
      if (!r["world_size"].is_number_integer() || r["world_size"].get<long long>() < 0 ||
          r["world_size"].get<long long>() > kMaxRanks)
        throw fail(where + ".world_size", "must be an integer in [0, " + std::to_string(kMaxRanks) + "]");
      row.worldSize = r["world_size"].get<int>();
    }
    if (r.contains("datatype")) {
      const auto type = r["datatype"].is_string() ? parseDataType(r["datatype"].get<std::string>()) : std::nullopt;
      if (!type) throw fail(where + ".datatype", "not a data type name (e.g. \"bf16\", \"float32\")");
      row.type = *type;
    }
    if (r.contains("registered")) {
      if (!r["registered"].is_boolean()) throw fail(where + ".registered", "must be true or false");
      row.registered = r["registered"].get<bool>();
    }
    if (r.contains("topology")) {
      const auto fabric =
          r["topology"].is_string() ? parseFabric(r["topology"].get<std::string>()) : std::nullopt;
      if (!fabric || *fabric == Fabric::Unknown)
        throw fail(where + ".topology", "must be \"nvswitch\", \"nvlink\" or \"pcie\"");
      row.fabric = *fabric;
    }
    if (r.contains("hosts")) {
      if (!r["hosts"].is_number_integer() || r["hosts"].get<long long>() < 0 ||
          r["hosts"].get<long long>() > kMaxHosts || r["hosts"].get<long long>() == 1)
        throw fail(where + ".hosts", "must be 0 (any) or an integer in [2, " + std::to_string(kMaxHosts) + "]");
      row.hosts = r["hosts"].get<int>();
    }
    if (r.contains("ranks_per_host")) {
      if (!row.hosts) throw fail(where + ".ranks_per_host", "applies to rows of calls across hosts (give \"hosts\")");
      if (!r["ranks_per_host"].is_number_integer() || r["ranks_per_host"].get<long long>() < 0 ||
          r["ranks_per_host"].get<long long>() > kMaxRanks)
        throw fail(where + ".ranks_per_host", "must be an integer in [0, " + std::to_string(kMaxRanks) + "]");
      row.ranksPerHost = r["ranks_per_host"].get<int>();
    }
    if (row.hosts && row.fabric) throw fail(where + ".topology", "applies to rows of one host only");
    if (row.hosts && row.registered) throw fail(where + ".registered", "applies to rows of one host only");
    if (!r.contains("max_bytes") || !r["max_bytes"].is_number_unsigned())
      throw fail(where + ".max_bytes", "missing or not a non-negative integer");
    row.maxBytes = r["max_bytes"].get<std::uint64_t>();
    if (!r.contains("algorithm") || !r["algorithm"].is_string()) throw fail(where + ".algorithm", "missing");
    row.algorithm = r["algorithm"].get<std::string>();
    if (row.hosts) {
      if (!parseAcrossHostsAlgorithm(row.algorithm))
        throw fail(where + ".algorithm", "'" + row.algorithm + "' is no algorithm across hosts (a row with \"hosts\" " +
                                             "names one: " + acrossHostsAlgorithmNames() + ")");
      rows.push_back(std::move(row));
      continue;
    }
    const Algorithm* a = findAlgorithm(row.algorithm);
    if (!a) throw fail(where + ".algorithm", "no algorithm is named '" + row.algorithm + "'");
    if (a->collective() != row.collective)
      throw fail(where + ".algorithm", "'" + row.algorithm + "' is an algorithm of " +
                                           std::string(toString(a->collective())) + ", not of " +
                                           std::string(toString(row.collective)));
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<TuningRow> loadTuningFile(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw Error(ErrorCode::InvalidUsage,
                "tuning table " + path + " cannot be opened (FERRY_TUNING_FILE names a missing file?)");
  std::ostringstream text;
  text << in.rdbuf();
  return parseTuning(text.str(), path);
}

std::string tuningToJson(const std::vector<TuningRow>& rows) {
  nlohmann::json doc = {{"version", 1}, {"rows", nlohmann::json::array()}};
  for (const auto& r : rows) {
    nlohmann::json row = {{"collective", std::string(toString(r.collective))},
                          {"world_size", r.worldSize},
                          {"max_bytes", r.maxBytes},
                          {"algorithm", r.algorithm}};
    if (r.type) row["datatype"] = std::string(toString(*r.type));
    if (r.registered) row["registered"] = *r.registered;
    if (r.fabric) row["topology"] = toString(*r.fabric);
    if (r.hosts) {
      row["hosts"] = *r.hosts;
      row["ranks_per_host"] = r.ranksPerHost;
    }
    doc["rows"].push_back(std::move(row));
  }
  return doc.dump(2) + "\n";
}

}  // namespace ferry
