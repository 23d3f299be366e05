// Ranks that the bootstrap sees on different hosts (FERRY_HOSTID set per rank, before anything in
// the process reads the environment): memory is described but not mapped, and CudaIpc/HostMemory
// connections are clear errors naming both hosts. Its own binary, so that no earlier test has
// parsed the environment in the parent before the fork.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstdlib>

#include "ferry/comm.hpp"
#include "ferry/communicator.hpp"
#include "ferry/env.hpp"
#include "ferry/memory.hpp"
#include "mp_harness.hpp"

namespace ferry::test {
namespace {

TEST(DifferentHosts, NoMappingAndNoSameHostConnection) {
  std::string root = "127.0.0.1:" + std::to_string(freePort(AF_INET));
  runRanksOk(2, [&](int rank) {
    std::string host = "fake-host-" + std::to_string(rank);
    setenv("FERRY_HOSTID", host.c_str(), 1);
    setenv("FERRY_BOOTSTRAP_SECRET", "different-hosts-test", 1);
    ASSERT_EQ(env().hostId, host) << "the environment was parsed before the fork";
    auto boot = TcpBootstrap::create(root, rank, 2);
    ASSERT_EQ(boot->numNodes(), 2);
    Communicator comm(boot);
    const int peer = 1 - rank;
    auto buf = hostAlloc(4096);
    comm.sendMemory(comm.registerMemory(buf.get(), 4096, Transport::HostMemory | Transport::Ethernet), peer);
    auto theirs = comm.recvMemory(peer);
    auto hostConn = comm.connect(peer, Transport::HostMemory);
    auto ipcConn = comm.connect(peer, Transport::CudaIpc, 1);
    RegisteredMemory m = theirs.get();
    EXPECT_EQ(m.data(), nullptr);
    EXPECT_EQ(m.size(), 4096u);
    EXPECT_EQ(m.rank(), peer);
    EXPECT_EQ(m.transports(), Transport::HostMemory | Transport::Ethernet);
    for (auto* f : {&hostConn, &ipcConn}) {
      try {
        f->get();
        ADD_FAILURE() << "connected across hosts";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::InvalidUsage) << e.what();
        std::string what = e.what();
        EXPECT_NE(what.find("different host ids"), std::string::npos) << what;
        EXPECT_NE(what.find("one host only"), std::string::npos) << what;
      }
    }
    boot->barrier();
  });
}

// Comm::whyNot across hosts: refused unless FERRY_MULTI_HOST=1, then taken for a TcpBootstrap, alike
// on every rank (the NCCL library and the torch backend decide from it whether to hand the
// communicator to NCCL). (No Comm is made: that needs GPUs, gpu_comm_across_hosts.)
TEST(DifferentHosts, CommAcrossHostsOnlyWithFerryMultiHost) {
  for (const char* multiHost : {"0", "1"}) {
    std::string root = "127.0.0.1:" + std::to_string(freePort(AF_INET));
    runRanksOk(2, [&](int rank) {
      setenv("FERRY_HOSTID", ("fake-host-" + std::to_string(rank)).c_str(), 1);
      setenv("FERRY_MULTI_HOST", multiHost, 1);
      setenv("FERRY_BOOTSTRAP_SECRET", "different-hosts-test", 1);
      auto boot = TcpBootstrap::create(root, rank, 2);
      const std::string why = Comm::whyNot(*boot);
      if (std::string(multiHost) == "1") {
        EXPECT_EQ(why, "");
      } else {
        EXPECT_NE(why.find("rank " + std::to_string(rank) + ": Comm needs every rank on one host: 1 of 2"),
                  std::string::npos)
            << why;
        EXPECT_NE(why.find("FERRY_MULTI_HOST=1"), std::string::npos) << why;
      }
      boot->barrier();
    });
  }
}

}  // namespace
}  // namespace ferry::test
