// The environment table: defaults, parsing of every type, errors that name the variable and the
// value, the NVLS gate (architecture.md rule 1), the table itself, and docs/env.md being up to date.
#include "ferry/env.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/env_internal.hpp"
#include "expect_contains.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

using Vars = std::map<std::string, std::string>;

Env parseMap(const Vars& vars) {
  return Env::parse([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// Parses {name=value} and returns the InvalidUsage message; fails the test if nothing is thrown.
std::string parseError(const std::string& name, const std::string& value) {
  try {
    parseMap({{name, value}});
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
    return e.what();
  }
  ADD_FAILURE() << name << "='" << value << "' was accepted";
  return {};
}

TEST(EnvDefaults, MatchTheDocumentedValues) {
  const Env e = parseMap({});
  EXPECT_EQ(e.log, "WARN");
  EXPECT_EQ(e.logFile, "");
  EXPECT_DOUBLE_EQ(e.bootstrapTimeout.count(), 120.0);
  EXPECT_DOUBLE_EQ(e.handshakeTimeout.count(), 10.0);
  EXPECT_EQ(e.bootstrapMaxMessage, 1ull << 30);
  EXPECT_EQ(e.bootstrapSecret, "");
  EXPECT_EQ(e.bootstrapPort, -1);
  EXPECT_EQ(e.socketIfname, "");
  EXPECT_EQ(e.socketFamily, "");
  EXPECT_EQ(e.hostId, "");
  EXPECT_DOUBLE_EQ(e.deviceTimeout.count(), 30.0);
  EXPECT_FALSE(e.enableNvls);
  EXPECT_EQ(e.ncclNvlsEnable, "");
  EXPECT_FALSE(e.torchSymmMemDisableMulticast);
  EXPECT_EQ(e.masterAddr, "");
  EXPECT_EQ(e.masterPort, -1);
  EXPECT_EQ(e.rank, -1);
  EXPECT_EQ(e.worldSize, -1);
  EXPECT_EQ(e.localRank, -1);
  EXPECT_EQ(e.torchelasticRunId, "");
}

TEST(EnvParse, ReadsExactlyTheVariablesOfTheTable) {
  std::set<std::string> asked;
  Env::parse([&](const char* name) -> const char* {
    asked.insert(name);
    return nullptr;
  });
  std::set<std::string> table;
  for (const EnvVarInfo& v : envTable()) table.insert(v.name);
  EXPECT_EQ(asked, table);
}

TEST(EnvParse, StringsAreTakenVerbatim) {
  const Env e = parseMap({{"FERRY_LOG", "INFO,TRACE:bootstrap"},
                          {"FERRY_LOG_FILE", "/tmp/ferry.%h.%p.log"},
                          {"FERRY_SOCKET_IFNAME", "^docker,lo"},
                          {"MASTER_ADDR", "node-1"},
                          {"TORCHELASTIC_RUN_ID", "job 7"}});
  EXPECT_EQ(e.log, "INFO,TRACE:bootstrap");
  EXPECT_EQ(e.logFile, "/tmp/ferry.%h.%p.log");
  EXPECT_EQ(e.socketIfname, "^docker,lo");
  EXPECT_EQ(e.masterAddr, "node-1");
  EXPECT_EQ(e.torchelasticRunId, "job 7");
}

struct BoolCase {
  const char* text;
  bool value;
};
class EnvBool : public ::testing::TestWithParam<BoolCase> {};

TEST_P(EnvBool, Parses) {
  EXPECT_EQ(parseMap({{"FERRY_ENABLE_NVLS", GetParam().text}}).enableNvls, GetParam().value);
  EXPECT_EQ(parseMap({{"TORCH_SYMM_MEM_DISABLE_MULTICAST", GetParam().text}}).torchSymmMemDisableMulticast,
            GetParam().value);
}

INSTANTIATE_TEST_SUITE_P(Values, EnvBool,
                         ::testing::Values(BoolCase{"1", true}, BoolCase{"true", true},
                                           BoolCase{"TRUE", true}, BoolCase{"yes", true},
                                           BoolCase{"on", true}, BoolCase{" On ", true}, BoolCase{"0", false},
                                           BoolCase{"false", false}, BoolCase{"no", false},
                                           BoolCase{"off", false}, BoolCase{"OFF", false},
                                           BoolCase{"", false}));

struct IntCase {
  const char* text;
  std::int64_t value;
};
class EnvInt : public ::testing::TestWithParam<IntCase> {};

TEST_P(EnvInt, Parses) {
  const Env e = parseMap({{"RANK", GetParam().text}, {"FERRY_BOOTSTRAP_PORT", GetParam().text}});
  EXPECT_EQ(e.rank, GetParam().value);
  EXPECT_EQ(e.bootstrapPort, GetParam().value);
}

INSTANTIATE_TEST_SUITE_P(Values, EnvInt,
                         ::testing::Values(IntCase{"0", 0}, IntCase{"42", 42}, IntCase{"-7", -7},
                                           IntCase{" 8 ", 8}, IntCase{"29500", 29500},
                                           IntCase{"9223372036854775807", INT64_MAX}));

struct SecondsCase {
  const char* text;
  double seconds;
};
class EnvSeconds : public ::testing::TestWithParam<SecondsCase> {};

TEST_P(EnvSeconds, Parses) {
  const Env e = parseMap({{"FERRY_BOOTSTRAP_TIMEOUT", GetParam().text}});
  EXPECT_DOUBLE_EQ(e.bootstrapTimeout.count(), GetParam().seconds);
  EXPECT_DOUBLE_EQ(
      parseMap({{"FERRY_BOOTSTRAP_HANDSHAKE_TIMEOUT", GetParam().text}}).handshakeTimeout.count(),
      GetParam().seconds);
}

INSTANTIATE_TEST_SUITE_P(Values, EnvSeconds,
                         ::testing::Values(SecondsCase{"120", 120.0}, SecondsCase{"0", 0.0},
                                           SecondsCase{"0.5", 0.5}, SecondsCase{"250ms", 0.25},
                                           SecondsCase{"1500ms", 1.5}, SecondsCase{"3s", 3.0},
                                           SecondsCase{" 2.5 ", 2.5}));

struct BytesCase {
  const char* text;
  std::uint64_t bytes;
};
class EnvBytes : public ::testing::TestWithParam<BytesCase> {};

TEST_P(EnvBytes, Parses) {
  EXPECT_EQ(parseMap({{"FERRY_BOOTSTRAP_MAX_MESSAGE", GetParam().text}}).bootstrapMaxMessage,
            GetParam().bytes);
}

INSTANTIATE_TEST_SUITE_P(Values, EnvBytes,
                         ::testing::Values(BytesCase{"0", 0}, BytesCase{"1024", 1024}, BytesCase{"4K", 4096},
                                           BytesCase{"4k", 4096}, BytesCase{"16M", 16ull << 20},
                                           BytesCase{"2G", 2ull << 30}, BytesCase{"1g", 1ull << 30},
                                           BytesCase{"3T", 3ull << 40},
                                           BytesCase{"18446744073709551615", UINT64_MAX}));

// Malformed values per type; every non-String variable of the table is tried with every value of its
// type, so a variable added to the table is covered without touching this test.
const std::map<std::string, std::vector<std::string>> kMalformed = {
    {"Bool", {"2", "maybe", "tru", "-1", "1.0"}},
    {"Int", {"", "x", "4.2", "12abc", "0x", "99999999999999999999"}},
    {"Seconds", {"", "abc", "-1", "ms", "1h", "inf", "nan", "5 s", "12x"}},
    {"Bytes", {"", "-1", "1Q", "K", "1.5G", "G1", "99999999999999999999", "20000000000T"}},
};

TEST(EnvErrors, MalformedValueOfEveryVariableNamesVariableAndValue) {
  int checked = 0;
  for (const EnvVarInfo& v : envTable()) {
    const std::string type = v.type;
    if (type == "String") continue;
    auto it = kMalformed.find(type);
    ASSERT_NE(it, kMalformed.end()) << v.name << " has type " << type << " that this test does not know";
    for (const std::string& bad : it->second) {
      SCOPED_TRACE(std::string(v.name) + "='" + bad + "'");
      const std::string what = parseError(v.name, bad);
      EXPECT_CONTAINS(what, std::string(v.name) + "='" + bad + "'");
      EXPECT_CONTAINS(what, "InvalidUsage");
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(EnvErrors, GoodDefaultOfEveryVariableParses) {
  // Each default, given explicitly, must be accepted (a table typo would make every process fail).
  for (const EnvVarInfo& v : envTable()) {
    SCOPED_TRACE(v.name);
    EXPECT_NO_THROW(parseMap({{v.name, v.defaultValue}}));
  }
}

TEST(EnvSocketFamily, AcceptsInetAndInet6) {
  EXPECT_EQ(parseMap({{"FERRY_SOCKET_FAMILY", "AF_INET"}}).socketFamily, "AF_INET");
  EXPECT_EQ(parseMap({{"FERRY_SOCKET_FAMILY", "AF_INET6"}}).socketFamily, "AF_INET6");
  EXPECT_EQ(parseMap({{"FERRY_SOCKET_FAMILY", ""}}).socketFamily, "");
}

class EnvSocketFamilyBad : public ::testing::TestWithParam<const char*> {};

TEST_P(EnvSocketFamilyBad, IsRejectedNamingTheValue) {
  const std::string what = parseError("FERRY_SOCKET_FAMILY", GetParam());
  EXPECT_CONTAINS(what, std::string("FERRY_SOCKET_FAMILY='") + GetParam() + "'");
  EXPECT_CONTAINS(what, "AF_INET6");
}

INSTANTIATE_TEST_SUITE_P(Values, EnvSocketFamilyBad,
                         ::testing::Values("AF_UNIX", "inet", "af_inet", "4", "AF_INET7"));

TEST(EnvCheckPointers, DefaultsToCachedAndTakesTheThreeModes) {
  EXPECT_EQ(parseMap({}).checkPointers, "cached");
  for (const char* mode : {"cached", "always", "never"}) EXPECT_EQ(parseMap({{"FERRY_CHECK_POINTERS", mode}}).checkPointers, mode);
  const std::string what = parseError("FERRY_CHECK_POINTERS", "1");
  EXPECT_CONTAINS(what, "FERRY_CHECK_POINTERS='1'");
  EXPECT_CONTAINS(what, "cached, always or never");
}

// A plan's port channels on one host: stores through the peer's mapping by default (docs/executor.md).
TEST(EnvPlanPorts, DefaultsToMemoryAndTakesProxy) {
  EXPECT_EQ(parseMap({}).planPorts, "memory");
  EXPECT_EQ(parseMap({{"FERRY_PLAN_PORTS", "proxy"}}).planPorts, "proxy");
  const std::string what = parseError("FERRY_PLAN_PORTS", "copy-engine");
  EXPECT_CONTAINS(what, "FERRY_PLAN_PORTS='copy-engine'");
  EXPECT_CONTAINS(what, "proxy or memory");
}

// What carries a Comm across hosts' cross-host phase (docs/multi-node.md).
TEST(EnvPartnerNet, DefaultsToAutoAndTakesFerryNcclAndSized) {
  EXPECT_EQ(parseMap({}).partnerNet, "auto");
  for (const char* net : {"auto", "ferry", "nccl", "sized"})
    EXPECT_EQ(parseMap({{"FERRY_PARTNER_NET", net}}).partnerNet, net);
  EXPECT_EQ(parseMap({}).partnerNcclBytes, 128u << 10);
  EXPECT_EQ(parseMap({{"FERRY_PARTNER_NCCL_BYTES", "1M"}}).partnerNcclBytes, 1u << 20);
  const std::string what = parseError("FERRY_PARTNER_NET", "ib");
  EXPECT_CONTAINS(what, "FERRY_PARTNER_NET='ib'");
  EXPECT_CONTAINS(what, "auto, ferry, nccl or sized");
}

// How calls that do not choose accumulate 16- and 8-bit float sums (docs/architecture.md).
TEST(EnvAccumulation, DefaultsToStepwiseAndTakesFloat32) {
  EXPECT_EQ(parseMap({}).accumulation, "stepwise");
  EXPECT_EQ(parseMap({{"FERRY_ACCUMULATION", "float32"}}).accumulation, "float32");
  const std::string what = parseError("FERRY_ACCUMULATION", "fp32");
  EXPECT_CONTAINS(what, "FERRY_ACCUMULATION='fp32'");
  EXPECT_CONTAINS(what, "stepwise or float32");
}

struct NvlsCase {
  const char* name;
  Vars vars;
  bool allowed;
};
class NvlsGate : public ::testing::TestWithParam<NvlsCase> {};

TEST_P(NvlsGate, FollowsRuleOne) { EXPECT_EQ(nvlsAllowed(parseMap(GetParam().vars)), GetParam().allowed); }

INSTANTIATE_TEST_SUITE_P(
    Cases, NvlsGate,
    ::testing::Values(
        NvlsCase{"OffByDefault", {}, false}, NvlsCase{"OnWhenEnabled", {{"FERRY_ENABLE_NVLS", "1"}}, true},
        NvlsCase{"OffWhenEnableIsZero", {{"FERRY_ENABLE_NVLS", "0"}}, false},
        NvlsCase{"NcclNvlsEnableZeroWins", {{"FERRY_ENABLE_NVLS", "1"}, {"NCCL_NVLS_ENABLE", "0"}}, false},
        NvlsCase{
            "NcclNvlsEnableZeroWithSpaces", {{"FERRY_ENABLE_NVLS", "1"}, {"NCCL_NVLS_ENABLE", " 0 "}}, false},
        NvlsCase{"NcclNvlsEnableOneKeepsIt", {{"FERRY_ENABLE_NVLS", "1"}, {"NCCL_NVLS_ENABLE", "1"}}, true},
        NvlsCase{"TorchDisableWins",
                 {{"FERRY_ENABLE_NVLS", "1"}, {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"}},
                 false},
        NvlsCase{"TorchDisableZeroKeepsIt",
                 {{"FERRY_ENABLE_NVLS", "1"}, {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "0"}},
                 true},
        NvlsCase{"BothDisablesWin",
                 {{"FERRY_ENABLE_NVLS", "1"},
                  {"NCCL_NVLS_ENABLE", "0"},
                  {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"}},
                 false},
        NvlsCase{"DisablesAloneDoNotEnable", {{"NCCL_NVLS_ENABLE", "1"}}, false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(EnvTable, NamesAreUniqueAndDescribed) {
  const std::set<std::string> types = {"Bool", "Int", "Seconds", "Bytes", "String"};
  std::set<std::string> names;
  ASSERT_FALSE(envTable().empty());
  for (const EnvVarInfo& v : envTable()) {
    ASSERT_NE(v.name, nullptr);
    EXPECT_TRUE(names.insert(v.name).second) << "duplicate " << v.name;
    ASSERT_NE(v.description, nullptr) << v.name;
    EXPECT_GT(std::string(v.description).size(), 10u) << v.name << " has no real description";
    ASSERT_NE(v.defaultValue, nullptr) << v.name;
    EXPECT_TRUE(types.count(v.type)) << v.name << " has type " << v.type;
  }
  for (const char* expected : {"FERRY_LOG", "FERRY_BOOTSTRAP_TIMEOUT", "FERRY_ENABLE_NVLS",
                               "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "FERRY_SOCKET_IFNAME"})
    EXPECT_TRUE(names.count(expected)) << expected << " is missing from the table";
}

TEST(EnvTable, MarkdownListsEveryVariable) {
  const std::string md = envMarkdown();
  for (const EnvVarInfo& v : envTable()) EXPECT_CONTAINS(md, std::string("| `") + v.name + "` | " + v.type);
}

// The Python package's variables (python/ferry/torch) are documented and are not typos to the
// startup log, which still flags a FERRY_ name that nothing reads.
TEST(EnvTable, ThePackagesVariablesAreKnown) {
  const std::string md = envMarkdown();
  const char* package[] = {"FERRY_TORCH_FORWARD", "FERRY_FUSED_PIPELINE", "FERRY_FUSED_REGISTERED"};
  for (const char* name : package) EXPECT_CONTAINS(md, std::string("| `") + name + "` |");
  for (const char* name : package) ASSERT_EQ(setenv(name, "1", 1), 0);
  ASSERT_EQ(setenv("FERRY_NO_SUCH_VARIABLE", "1", 1), 0);
  const std::vector<std::string> unknown = detail::envUnknownFerryVariables();
  for (const char* name : package) {
    EXPECT_EQ(std::count(unknown.begin(), unknown.end(), name), 0) << name;
    unsetenv(name);
  }
  EXPECT_EQ(std::count(unknown.begin(), unknown.end(), "FERRY_NO_SUCH_VARIABLE"), 1);
  unsetenv("FERRY_NO_SUCH_VARIABLE");
}

TEST(EnvDoc, DocsEnvMdIsUpToDate) {
  const std::string path = std::string(FERRY_SOURCE_DIR) + "/docs/env.md";
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(in.good() || in.eof()) << "cannot read " << path;
  EXPECT_TRUE(text.str() == envMarkdown()) << "docs/env.md is out of date: run scripts/update-env-doc.sh";
}

}  // namespace
}  // namespace ferry
