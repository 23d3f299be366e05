// nccl_net (platform/nccl_net.hpp): NCCL for a Comm across hosts' network, opened at run time. This
// machine may have no NCCL at all, so what is checked is the answer when it cannot be opened: no
// library, a message naming the file and the variable that names it, the same answer again.
#include "platform/nccl_net.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "ferry/env.hpp"

namespace ferry {
namespace {

TEST(NcclNet, AFileThatDoesNotOpenGivesNoLibraryAndSaysWhy) {
  // (Before anything in this process reads the environment: this binary holds this test alone.)
  ::setenv("FERRY_NCCL_FALLBACK", "/nonexistent/libnccl.so.2", 1);
  ASSERT_EQ(env().ncclFallback, "/nonexistent/libnccl.so.2");
  std::string why;
  EXPECT_EQ(nccl_net::library(why), nullptr);
  EXPECT_NE(why.find("/nonexistent/libnccl.so.2"), std::string::npos) << why;
  EXPECT_NE(why.find("FERRY_NCCL_FALLBACK"), std::string::npos) << why;
  std::string again;
  EXPECT_EQ(nccl_net::library(again), nullptr);  // opened once: the same answer
  EXPECT_EQ(again, why);
  // NVLink multicast stays off in NCCL (architecture.md rule 1), set before NCCL is opened.
  if (!nvlsAllowed()) {
    EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  }
}

}  // namespace
}  // namespace ferry
