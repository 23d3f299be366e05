// nccl_net (platform/nccl_net.hpp): NCCL for a Comm across hosts' network, opened at run time. NCCL
// is opened once per process, so each case is a run of this program of its own (ctest entries
// unit_nccl_net_*), named by NCCL_NET_TEST_CASE, with FERRY_NCCL_FALLBACK pointing at a file that
// does not exist, at a stand-in that lacks functions (fake_nccl.c, partial), or at a whole one.
#include "platform/nccl_net.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "ferry/env.hpp"

namespace ferry {
namespace {

std::string testCase() {
  const char* c = std::getenv("NCCL_NET_TEST_CASE");
  return c != nullptr ? c : "";
}

TEST(NcclNet, AFileThatDoesNotOpenGivesNoLibraryAndSaysWhy) {
  if (testCase() != "missing") GTEST_SKIP() << "NCCL_NET_TEST_CASE=missing runs this";
  std::string why;
  EXPECT_EQ(nccl_net::library(why), nullptr);
  EXPECT_NE(why.find(env().ncclFallback), std::string::npos) << why;
  EXPECT_NE(why.find("FERRY_NCCL_FALLBACK"), std::string::npos) << why;
  std::string again;
  EXPECT_EQ(nccl_net::library(again), nullptr);  // opened once: the same answer
  EXPECT_EQ(again, why);
}

TEST(NcclNet, ALibraryThatLacksFunctionsIsRefusedNamingThem) {
  if (testCase() != "partial") GTEST_SKIP() << "NCCL_NET_TEST_CASE=partial runs this";
  std::string why;
  EXPECT_EQ(nccl_net::library(why), nullptr);
  EXPECT_NE(why.find("ncclCommAbort"), std::string::npos) << why;
  EXPECT_NE(why.find("ncclSend"), std::string::npos) << why;
  EXPECT_EQ(why.find("ncclRecv"), std::string::npos) << why;  // (it has that one)
}

TEST(NcclNet, AWholeLibraryOpensWithTheHostsAndMulticastFerrySets) {
  if (testCase() != "whole") GTEST_SKIP() << "NCCL_NET_TEST_CASE=whole runs this";
  ASSERT_EQ(std::getenv("NCCL_HOSTID"), nullptr) << "the test's environment set NCCL_HOSTID";
  std::string why;
  const nccl_net::Library* nccl = nccl_net::library(why);
  ASSERT_NE(nccl, nullptr) << why;
  EXPECT_EQ(nccl->version, 22809);
  EXPECT_EQ(nccl->path, env().ncclFallback);
  // NCCL sees the hosts ferry sees, and NVLink multicast stays off in it (architecture.md rule 1).
  ASSERT_NE(std::getenv("NCCL_HOSTID"), nullptr);
  EXPECT_EQ(std::string(std::getenv("NCCL_HOSTID")), env().hostId);
  if (!nvlsAllowed()) {
    EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  }
  int async = -1;
  EXPECT_EQ(nccl->commGetAsyncError(nullptr, &async), nccl_net::kSuccess);
  EXPECT_EQ(async, nccl_net::kSuccess);
  EXPECT_EQ(nccl_net::describe(*nccl, nullptr, "ncclSend", 3).find("NCCL 22809"), 0u);
}

}  // namespace
}  // namespace ferry
