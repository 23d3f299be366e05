// The algorithms of a call across hosts (comm/across_hosts_algorithms.hpp): where the pipelined
// allReduce runs and why not elsewhere, how it cuts a call into pieces and parts, its choice by the
// tuning table's rows that name hosts (keyed by hosts x ranks per host), and those rows in files.
#include "comm/across_hosts_algorithms.hpp"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "expect_contains.hpp"
#include "invalid_usage.hpp"

namespace ferry {
namespace {

using testing::invalidUsageOf;

// `hosts` hosts of `perHost` consecutive ranks each.
HostLayout evenLayout(int hosts, int perHost) {
  std::vector<int> host, local;
  for (int h = 0; h < hosts; ++h)
    for (int l = 0; l < perHost; ++l) {
      host.push_back(h);
      local.push_back(l);
    }
  return HostLayout(host, local, hosts);
}

CollectiveCall allReduceOf(std::size_t count, DataType type, int worldSize) {
  CollectiveCall call;
  call.collective = Collective::AllReduce;
  call.count = count;
  call.type = type;
  call.worldSize = worldSize;
  return call;
}

TEST(AcrossHostsPieces, PartsOfWhole16BytesOnePerRankOfAHost) {
  EXPECT_EQ(acrossHostsUnit(4, 2), 8u);   // float32, 2 ranks a host: 4 floats a part
  EXPECT_EQ(acrossHostsUnit(2, 8), 64u);  // bf16, 8 ranks
  EXPECT_EQ(acrossHostsUnit(8, 4), 8u);   // double, 4 ranks
  EXPECT_EQ(acrossHostsUnit(1, 3), 48u);  // 8-bit, 3 ranks
}

TEST(AcrossHostsPieces, CoverTheCallInWholeUnitsAndAtMost64Pieces) {
  struct Case {
    std::uint64_t count, elementBytes;
    int perHost;
    std::uint64_t pieceBytes;
  };
  for (const Case c : {Case{8, 4, 2, 4 << 20}, Case{1 << 20, 4, 2, 1 << 20}, Case{(64u << 20) / 2, 2, 4, 4 << 20},
                       Case{(1u << 30) / 4, 4, 8, 4 << 20}, Case{8 * 1000, 4, 2, 0}, Case{8 * 1001, 4, 2, 64 << 10},
                       Case{48 * 7, 1, 3, 48}}) {
    const std::uint64_t unit = acrossHostsUnit(c.elementBytes, c.perHost);
    ASSERT_EQ(c.count % unit, 0u);
    const AcrossHostsPieces p = acrossHostsPieces(c.count, c.elementBytes, c.perHost, c.pieceBytes);
    SCOPED_TRACE(std::to_string(c.count) + " x " + std::to_string(c.elementBytes) + " B, " +
                 std::to_string(c.perHost) + " a host, pieces of " + std::to_string(c.pieceBytes) + " B");
    EXPECT_GE(p.pieces, 1u);
    EXPECT_LE(p.pieces, kMaxAcrossHostsPieces);
    EXPECT_EQ(p.pieceCount % unit, 0u);
    // Every piece but the last is whole, the last is not empty, and together they are the call.
    EXPECT_GE(p.pieces * p.pieceCount, c.count);
    EXPECT_LT((p.pieces - 1) * p.pieceCount, c.count);
    const std::uint64_t last = c.count - (p.pieces - 1) * p.pieceCount;
    EXPECT_EQ(last % unit, 0u);
    if (p.pieces < kMaxAcrossHostsPieces && c.pieceBytes >= unit * c.elementBytes) {
      EXPECT_LE(p.pieceCount * c.elementBytes, c.pieceBytes);  // no larger than asked, unless capped
    }
  }
  // 1 MiB of floats in 1 MiB pieces: one piece.
  EXPECT_EQ(acrossHostsPieces(1 << 18, 4, 2, 1 << 20).pieces, 1u);
  // 256 MiB in 4 MiB pieces: the cap of 64.
  EXPECT_EQ(acrossHostsPieces((256u << 20) / 4, 4, 2, 4 << 20).pieces, 64u);
}

TEST(AcrossHostsAlgorithms, PipelinedRunsAllReduceOnEvenConsecutiveHostsOfWholeParts) {
  const HostLayout twoByTwo = evenLayout(2, 2);
  EXPECT_EQ(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, allReduceOf(1024, DataType::Float32, 4), twoByTwo),
            "");
  EXPECT_EQ(whyNotAcrossHosts(AcrossHostsAlgorithm::Phases, allReduceOf(1023, DataType::Float32, 4), twoByTwo), "");
  EXPECT_CONTAINS(
      whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, allReduceOf(1020, DataType::Float32, 4), twoByTwo),
      "not a positive multiple of 8");
  CollectiveCall gather = allReduceOf(1021, DataType::Float32, 4);  // (any count)
  gather.collective = Collective::AllGather;
  EXPECT_EQ(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, gather, twoByTwo), "");
  EXPECT_CONTAINS(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, gather, evenLayout(2, 1)), "one rank each");
  CollectiveCall broadcast = allReduceOf(1024, DataType::Float32, 4);
  broadcast.collective = Collective::Broadcast;
  EXPECT_EQ(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, broadcast, twoByTwo), "");
  broadcast.count = 1020;  // (parts of whole 16 bytes, as the allReduce's)
  EXPECT_CONTAINS(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, broadcast, twoByTwo), "multiple of 8");
  CollectiveCall scatter = broadcast;  // (pieces of a rank's chunk of whole 16 bytes: 1020 floats are)
  scatter.collective = Collective::ReduceScatter;
  EXPECT_EQ(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, scatter, twoByTwo), "");
  scatter.count = 1022;
  EXPECT_CONTAINS(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, scatter, twoByTwo),
                  "multiple of 4 (pieces of whole 16 bytes)");
  CollectiveCall toAll = gather;  // (any count)
  toAll.collective = Collective::AllToAll;
  EXPECT_EQ(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, toAll, twoByTwo), "");
  EXPECT_CONTAINS(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, toAll, evenLayout(2, 1)), "one rank each");
  CollectiveCall reduce = broadcast;  // (pieces of the buffer of whole 16 bytes, as reduceScatter's)
  reduce.collective = Collective::Reduce;
  EXPECT_EQ(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, reduce, twoByTwo), "");
  reduce.count = 1022;
  EXPECT_CONTAINS(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, reduce, twoByTwo),
                  "multiple of 4 (pieces of whole 16 bytes)");
  EXPECT_CONTAINS(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, broadcast, evenLayout(2, 1)), "one rank each");
  EXPECT_CONTAINS(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, allReduceOf(1024, DataType::Float32, 2),
                                    evenLayout(2, 1)),
                  "one rank each");
  EXPECT_CONTAINS(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, allReduceOf(1024, DataType::Float32, 4),
                                    HostLayout({0, 0, 0, 1}, {0, 1, 2, 0}, 2)),
                  "different numbers of ranks");
  EXPECT_CONTAINS(whyNotAcrossHosts(AcrossHostsAlgorithm::Pipelined, allReduceOf(1024, DataType::Float32, 4),
                                    HostLayout({0, 1, 0, 1}, {0, 0, 1, 1}, 2)),
                  "not consecutive");
}

TEST(AcrossHostsAlgorithms, NamesAreTheTwoForms) {
  EXPECT_EQ(parseAcrossHostsAlgorithm("across_hosts"), AcrossHostsAlgorithm::Phases);
  EXPECT_EQ(parseAcrossHostsAlgorithm("across_hosts_pipelined"), AcrossHostsAlgorithm::Pipelined);
  EXPECT_FALSE(parseAcrossHostsAlgorithm("allreduce_ll"));
  EXPECT_FALSE(parseAcrossHostsAlgorithm(""));
  EXPECT_EQ(acrossHostsAlgorithmNames(), "across_hosts, across_hosts_pipelined");
}

TuningRow acrossHostsRow(int hosts, int perHost, std::uint64_t maxBytes, const char* algorithm) {
  TuningRow row{Collective::AllReduce, 0, maxBytes, algorithm};
  row.hosts = hosts;
  row.ranksPerHost = perHost;
  return row;
}

TEST(AcrossHostsSelection, RowsKeyedByHostsAndRanksPerHost) {
  const std::vector<TuningRow> rows = {
      acrossHostsRow(2, 4, ~0ull, "across_hosts"),        // 2 hosts of 4: phases
      acrossHostsRow(2, 0, 1 << 20, "across_hosts"),      // 2 hosts of any other size: phases to 1 MiB
      acrossHostsRow(0, 0, ~0ull, "across_hosts_pipelined"),
  };
  const CollectiveCall big = allReduceOf(1 << 20, DataType::Float32, 4);  // 4 MiB
  const CollectiveCall small = allReduceOf(1 << 10, DataType::Float32, 4);
  EXPECT_EQ(selectAcrossHosts(rows, "", big, evenLayout(2, 2)), AcrossHostsAlgorithm::Pipelined);
  EXPECT_EQ(selectAcrossHosts(rows, "", small, evenLayout(2, 2)), AcrossHostsAlgorithm::Phases);
  CollectiveCall big8 = big;
  big8.worldSize = 8;
  EXPECT_EQ(selectAcrossHosts(rows, "", big8, evenLayout(2, 4)), AcrossHostsAlgorithm::Phases);
  EXPECT_EQ(selectAcrossHosts(rows, "", big8, evenLayout(4, 2)), AcrossHostsAlgorithm::Pipelined);
  // A row whose algorithm cannot run the call is passed over: an odd count runs as phases.
  EXPECT_EQ(selectAcrossHosts(rows, "", allReduceOf((1 << 20) + 1, DataType::Float32, 4), evenLayout(2, 2)),
            AcrossHostsAlgorithm::Phases);
  // Rows of one host do not apply across hosts, nor rows across hosts on one host.
  const std::vector<TuningRow> oneHost = {{Collective::AllReduce, 0, ~0ull, "allreduce_ll"}};
  EXPECT_EQ(selectAcrossHosts(oneHost, "", big, evenLayout(2, 2)), AcrossHostsAlgorithm::Phases);
  EXPECT_FALSE(rows[2].matches(big, Fabric::NvSwitch));
}

TEST(AcrossHostsSelection, ReduceRowsPipelineAndTheDefaultTableLeavesReduceToPhases) {
  CollectiveCall reduce = allReduceOf(1 << 20, DataType::BFloat16, 4);
  reduce.collective = Collective::Reduce;
  TuningRow row = acrossHostsRow(0, 0, ~0ull, "across_hosts_pipelined");
  row.collective = Collective::Reduce;
  EXPECT_EQ(selectAcrossHosts({row}, "", reduce, evenLayout(2, 2)), AcrossHostsAlgorithm::Pipelined);
  EXPECT_EQ(selectAcrossHosts(defaultTuning(), "", reduce, evenLayout(2, 2)), AcrossHostsAlgorithm::Phases);
  EXPECT_EQ(selectAcrossHosts(defaultTuning(), "across_hosts_pipelined", reduce, evenLayout(2, 2)),
            AcrossHostsAlgorithm::Pipelined);
  reduce.count = 1001;  // (pieces of whole 16 bytes: the row is passed over, a forced choice refused)
  EXPECT_EQ(selectAcrossHosts({row}, "", reduce, evenLayout(2, 2)), AcrossHostsAlgorithm::Phases);
  EXPECT_CONTAINS(invalidUsageOf([&] {
                    selectAcrossHosts(defaultTuning(), "across_hosts_pipelined", reduce, evenLayout(2, 2), 1);
                  }),
                  "pieces of whole 16 bytes");
}

TEST(AcrossHostsSelection, TheDefaultTablePipelinesWhereItRuns) {
  const std::vector<TuningRow> rows = defaultTuning();
  EXPECT_EQ(selectAcrossHosts(rows, "", allReduceOf(1 << 20, DataType::BFloat16, 4), evenLayout(2, 2)),
            AcrossHostsAlgorithm::Pipelined);
  EXPECT_EQ(selectAcrossHosts(rows, "", allReduceOf(1 << 20, DataType::BFloat16, 2), evenLayout(2, 1)),
            AcrossHostsAlgorithm::Phases);
}

TEST(AcrossHostsSelection, AForcedAlgorithmWinsOrSaysWhyItCannotRun) {
  const std::vector<TuningRow> rows = defaultTuning();
  const CollectiveCall call = allReduceOf(1 << 20, DataType::BFloat16, 4);
  EXPECT_EQ(selectAcrossHosts(rows, "across_hosts", call, evenLayout(2, 2)), AcrossHostsAlgorithm::Phases);
  EXPECT_EQ(selectAcrossHosts(rows, "across_hosts_pipelined", call, evenLayout(2, 2)),
            AcrossHostsAlgorithm::Pipelined);
  const std::string msg = invalidUsageOf([&] {
    selectAcrossHosts(rows, "across_hosts_pipelined", allReduceOf(1001, DataType::BFloat16, 4), evenLayout(2, 2), 3);
  });
  EXPECT_CONTAINS(msg, "rank 3: allreduce of 1001");
  EXPECT_CONTAINS(msg, "forced algorithm across hosts across_hosts_pipelined cannot run this call");
  EXPECT_CONTAINS(msg, "not a positive multiple of 16");
  EXPECT_CONTAINS(msg, "setAlgorithm / FERRY_ALGO");
}

TEST(AcrossHostsForcing, FerryAlgoNamesThemBesideTheHostsAlgorithms) {
  std::array<std::string, kCollectiveCount> across;
  const auto onHost = parseForcedAlgorithms("allreduce=across_hosts, allgather_ll, broadcast=across_hosts", &across);
  EXPECT_EQ(onHost[static_cast<int>(Collective::AllGather)], "allgather_ll");
  EXPECT_EQ(onHost[static_cast<int>(Collective::AllReduce)], "");
  EXPECT_EQ(across[static_cast<int>(Collective::AllReduce)], "across_hosts");
  EXPECT_EQ(across[static_cast<int>(Collective::Broadcast)], "across_hosts");
  across = {};
  const auto host = parseForcedAlgorithms("allreduce=across_hosts_pipelined,allreduce_ll", &across);
  EXPECT_EQ(across[static_cast<int>(Collective::AllReduce)], "across_hosts_pipelined");
  EXPECT_EQ(host[static_cast<int>(Collective::AllReduce)], "allreduce_ll");  // the host's phases keep theirs
  EXPECT_CONTAINS(invalidUsageOf([&] { parseForcedAlgorithms("across_hosts", &across); }), "name the collective");
  EXPECT_CONTAINS(invalidUsageOf([&] { parseForcedAlgorithms("across_hosts_pipelined", &across); }),
                  "name the collective");
  across = {};
  parseForcedAlgorithms("reduce=across_hosts_pipelined", &across);  // (every collective has both forms)
  EXPECT_EQ(across[static_cast<int>(Collective::Reduce)], "across_hosts_pipelined");
  EXPECT_CONTAINS(invalidUsageOf([&] { parseForcedAlgorithms("allsum=across_hosts", &across); }),
                  "unknown collective 'allsum'");
  EXPECT_CONTAINS(invalidUsageOf([&] {
                    parseForcedAlgorithms("allreduce=across_hosts,allreduce=across_hosts_pipelined", &across);
                  }),
                  "two algorithms across hosts of allreduce");
  // Where the caller takes none (one host's names only), they are unknown names.
  EXPECT_CONTAINS(invalidUsageOf([] { parseForcedAlgorithms("across_hosts_pipelined"); }),
                  "no algorithm is named 'across_hosts_pipelined'");
}

TEST(AcrossHostsForcing, TheSelectorKeepsThemApartFromTheHostsForcedAlgorithm) {
  Selector s(defaultTuning());
  s.force(Collective::AllReduce, "allreduce_ll");
  s.force(Collective::AllReduce, "across_hosts_pipelined");
  EXPECT_EQ(s.forced(Collective::AllReduce), "allreduce_ll");
  EXPECT_EQ(s.forcedAcrossHosts(Collective::AllReduce), "across_hosts_pipelined");
  EXPECT_EQ(s.forcedAcrossHosts(Collective::AllGather), "");
  s.force(Collective::AllReduce, "");
  EXPECT_EQ(s.forced(Collective::AllReduce), "");
  EXPECT_EQ(s.forcedAcrossHosts(Collective::AllReduce), "");
}

std::string table(const std::string& rows) { return "{\"version\": 1, \"rows\": [" + rows + "]}"; }

TEST(AcrossHostsTuningFile, ReadsHostsAndRanksPerHostAndRoundTrips) {
  const auto rows = parseTuning(table("{\"collective\": \"allreduce\", \"hosts\": 2, \"ranks_per_host\": 8, "
                                      "\"max_bytes\": 1048576, \"algorithm\": \"across_hosts\"}, "
                                      "{\"collective\": \"allreduce\", \"hosts\": 0, \"max_bytes\": 0, "
                                      "\"algorithm\": \"across_hosts_pipelined\"}"),
                                "inline");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].hosts, 2);
  EXPECT_EQ(rows[0].ranksPerHost, 8);
  EXPECT_EQ(rows[1].hosts, 0);
  EXPECT_EQ(rows[1].ranksPerHost, 0);
  EXPECT_EQ(parseTuning(tuningToJson(rows), "round trip"), rows);
}

TEST(AcrossHostsTuningFile, MalformedRowsAreInvalidUsageNamingTheField) {
  const auto error = [](const std::string& row) {
    return invalidUsageOf([&] { parseTuning(table(row), "hosts.json"); });
  };
  EXPECT_CONTAINS(error("{\"collective\": \"allreduce\", \"hosts\": 1, \"max_bytes\": 1, \"algorithm\": "
                        "\"across_hosts\"}"),
                  "rows[0].hosts");
  EXPECT_CONTAINS(error("{\"collective\": \"allreduce\", \"hosts\": 9, \"max_bytes\": 1, \"algorithm\": "
                        "\"across_hosts\"}"),
                  "rows[0].hosts");
  EXPECT_CONTAINS(error("{\"collective\": \"allreduce\", \"ranks_per_host\": 2, \"max_bytes\": 1, \"algorithm\": "
                        "\"allreduce_ll\"}"),
                  "rows[0].ranks_per_host");
  EXPECT_CONTAINS(error("{\"collective\": \"allreduce\", \"hosts\": 2, \"max_bytes\": 1, \"algorithm\": "
                        "\"allreduce_ll\"}"),
                  "'allreduce_ll' is no algorithm across hosts");
  EXPECT_CONTAINS(error("{\"collective\": \"allreduce\", \"hosts\": 2, \"topology\": \"pcie\", \"max_bytes\": 1, "
                        "\"algorithm\": \"across_hosts\"}"),
                  "rows[0].topology");
  EXPECT_CONTAINS(error("{\"collective\": \"allreduce\", \"hosts\": 2, \"registered\": true, \"max_bytes\": 1, "
                        "\"algorithm\": \"across_hosts\"}"),
                  "rows[0].registered");
  // A row of one host cannot name an algorithm across hosts.
  EXPECT_CONTAINS(error("{\"collective\": \"allreduce\", \"max_bytes\": 1, \"algorithm\": \"across_hosts\"}"),
                  "rows[0].algorithm");
}

}  // namespace
}  // namespace ferry
