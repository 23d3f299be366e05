// What of the topology can be checked without a GPU: DynamicLibrary, PCI address spelling, the
// NVLink pair logic on fake NVSwitch and direct-link layouts, the InfiniBand sysfs fallback, and that
// queryTopology() on a machine without a driver reports zero GPUs with a reason instead of throwing.
#include "ferry/topology.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/dynamic_library.hpp"
#include "expect_contains.hpp"
#include "platform/ibverbs_api.hpp"
#include "platform/nvlink_matrix.hpp"
#include "platform/nvml_api.hpp"
#include "platform/pci_bus_id.hpp"

namespace ferry {
namespace {

TEST(DynamicLibrary, MissingLibraryIsInvalidWithTheReason) {
  DynamicLibrary lib = DynamicLibrary::open({"libferry-no-such-lib.so.1", "libferry-no-such-lib.so"});
  EXPECT_FALSE(lib);
  EXPECT_TRUE(lib.name().empty());
  // dlerror() names each file tried.
  EXPECT_CONTAINS(lib.error(), "libferry-no-such-lib.so.1");
  EXPECT_CONTAINS(lib.error(), "libferry-no-such-lib.so:");
  EXPECT_EQ(lib.rawSymbol("strlen"), nullptr);
}

TEST(DynamicLibrary, FindsSymbolsOfLibcAndNullForMissingOnes) {
  DynamicLibrary lib = DynamicLibrary::open({"libferry-no-such-lib.so", "libc.so.6"});
  ASSERT_TRUE(lib) << lib.error();
  EXPECT_EQ(lib.name(), "libc.so.6");
  EXPECT_TRUE(lib.error().empty());
  auto length = lib.symbol<std::size_t (*)(const char*)>("strlen");
  ASSERT_NE(length, nullptr);
  EXPECT_EQ(length("ferry"), 5u);
  EXPECT_EQ(lib.symbol<int (*)()>("ferry_no_such_symbol"), nullptr);

  DynamicLibrary moved = std::move(lib);
  EXPECT_FALSE(lib);  // NOLINT(bugprone-use-after-move): the moved-from state is part of the contract
  EXPECT_NE(moved.symbol<std::size_t (*)(const char*)>("strlen"), nullptr);
}

TEST(PciBusId, NvmlCudaAndSysfsSpellingsAgree) {
  EXPECT_EQ(normalizePciBusId("00000000:1B:00.0"), "0000:1b:00.0");  // NVML
  EXPECT_EQ(normalizePciBusId("0000:1B:00.0"), "0000:1b:00.0");      // CUDA
  EXPECT_EQ(normalizePciBusId("0000:1b:00.0"), "0000:1b:00.0");      // sysfs
  EXPECT_EQ(normalizePciBusId("10000:E1:1F.7"), "10000:e1:1f.7");    // VMD domains have 5 digits
  EXPECT_EQ(normalizePciBusId("Not-A-Bus-Id"), "not-a-bus-id");
  EXPECT_EQ(normalizePciBusId("0000:1b:00.0x"), "0000:1b:00.0x");  // trailing junk: not parsed
}

GpuInfo fakeGpu(int index, std::vector<NvlinkLink> links) {
  GpuInfo gpu;
  gpu.index = index;
  gpu.pciBusId = "0000:" + std::to_string(10 + index) + ":00.0";
  gpu.nvlinks = std::move(links);
  return gpu;
}

std::vector<NvlinkLink> linksTo(NvlinkRemote remote, int count, const std::string& busId = "",
                                int first = 0) {
  std::vector<NvlinkLink> links;
  for (int i = 0; i < count; ++i) links.push_back({first + i, remote, busId});
  return links;
}

TEST(NvlinkMatrix, NvSwitchPairsGetTheSmallerLinkCount) {
  // HGX H100/H200: 18 links per GPU, all to NVSwitches; GPU 3 has lost two links.
  std::vector<GpuInfo> gpus;
  for (int i = 0; i < 3; ++i) gpus.push_back(fakeGpu(i, linksTo(NvlinkRemote::Switch, 18, "0000:c0:00.0")));
  gpus.push_back(fakeGpu(3, linksTo(NvlinkRemote::Switch, 16, "0000:c0:00.0")));

  auto m = nvlinkMatrix(gpus);
  ASSERT_EQ(m.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(m[i].size(), 4u);
    for (std::size_t j = 0; j < 4; ++j) {
      if (i == j) {
        EXPECT_EQ(m[i][j].links, 0);
        EXPECT_FALSE(m[i][j].viaSwitch);
        continue;
      }
      EXPECT_TRUE(m[i][j].viaSwitch) << i << "," << j;
      EXPECT_EQ(m[i][j].links, (i == 3 || j == 3) ? 16 : 18) << i << "," << j;
    }
  }
}

TEST(NvlinkMatrix, DirectLinksCountOnlyLinksToThatGpu) {
  // A partial mesh: 0-1 by two links, 0-2 by one, 1-2 by one, GPU 3 on PCIe only. Links to a CPU or
  // an unknown far end join no GPU pair.
  std::vector<GpuInfo> gpus = {fakeGpu(0, {}), fakeGpu(1, {}), fakeGpu(2, {}), fakeGpu(3, {})};
  auto connect = [&](int a, int b, int count) {
    for (int k = 0; k < count; ++k) {
      gpus[a].nvlinks.push_back(
          {static_cast<int>(gpus[a].nvlinks.size()), NvlinkRemote::Gpu, gpus[b].pciBusId});
      gpus[b].nvlinks.push_back(
          {static_cast<int>(gpus[b].nvlinks.size()), NvlinkRemote::Gpu, gpus[a].pciBusId});
    }
  };
  connect(0, 1, 2);
  connect(0, 2, 1);
  connect(1, 2, 1);
  gpus[2].nvlinks.push_back({5, NvlinkRemote::Other, "0000:00:01.0"});
  gpus[2].nvlinks.push_back({6, NvlinkRemote::Unknown, ""});

  auto m = nvlinkMatrix(gpus);
  const int want[4][4] = {{0, 2, 1, 0}, {2, 0, 1, 0}, {1, 1, 0, 0}, {0, 0, 0, 0}};
  for (std::size_t i = 0; i < 4; ++i) {
    for (std::size_t j = 0; j < 4; ++j) {
      EXPECT_EQ(m[i][j].links, want[i][j]) << i << "," << j;
      EXPECT_FALSE(m[i][j].viaSwitch) << i << "," << j;
    }
  }
}

TEST(NvlinkMatrix, NoGpusGiveAnEmptyMatrix) { EXPECT_TRUE(nvlinkMatrix({}).empty()); }

class IbSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("ferry-ib-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(IbSysfs, ListsTheKernelsDevicesWhenLibibverbsHasNone) {
  std::filesystem::create_directory(dir_ / "mlx5_1");
  std::filesystem::create_directory(dir_ / "mlx5_0");
  ibverbs::DeviceList list = ibverbs::listDevices(dir_.string());
  if (list.source == "libibverbs") GTEST_SKIP() << "this machine has RDMA devices; the fallback is not used";
  EXPECT_EQ(list.source, dir_.string());
  EXPECT_EQ(list.names, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
  EXPECT_TRUE(list.reason.empty());
}

TEST_F(IbSysfs, NoDevicesAnywhereSaysWhy) {
  ibverbs::DeviceList list = ibverbs::listDevices((dir_ / "missing").string());
  if (list.source == "libibverbs") GTEST_SKIP() << "this machine has RDMA devices";
  EXPECT_TRUE(list.names.empty());
  EXPECT_TRUE(list.source.empty());
  EXPECT_CONTAINS(list.reason, "missing");
}

TEST(Nvml, UnavailableNvmlSaysWhy) {
  nvml::NvlinkReport report = nvml::queryNvlinks({});
  if (report.available) GTEST_SKIP() << "NVML works here";
  EXPECT_CONTAINS(report.reason, "NVML");
  EXPECT_TRUE(report.links.empty());
}

TEST(Topology, QueryNeverThrowsAndIsConsistent) {
  Topology topo;
  ASSERT_NO_THROW(topo = queryTopology());
  EXPECT_GT(topo.runtimeVersion, 0);
  const std::size_t n = topo.gpus.size();
  if (topo.driverVersion == 0) {
    // No driver (the CI machines): zero GPUs, and the reason says so.
    EXPECT_EQ(n, 0u);
    EXPECT_CONTAINS(topo.gpuStatus, "cudaGetDeviceCount");
    EXPECT_CONTAINS(topo.gpuStatus, "no NVIDIA driver");
  }
  if (n == 0) {
    EXPECT_FALSE(topo.gpuStatus.empty());
    EXPECT_TRUE(topo.nvlink.empty());
    EXPECT_FALSE(topo.nvlinkStatus.empty());
  }
  ASSERT_EQ(topo.peerAccess.size(), n);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(topo.peerAccess[i].size(), n);
    EXPECT_TRUE(topo.peerAccess[i][i]);
    EXPECT_EQ(topo.gpus[i].index, static_cast<int>(i));
    EXPECT_EQ(topo.gpus[i].pciBusId, normalizePciBusId(topo.gpus[i].pciBusId));
  }
  EXPECT_TRUE(topo.nvlink.empty() || topo.nvlink.size() == n);
  EXPECT_NE(topo.nvlink.empty(), topo.nvlinkStatus.empty());
  EXPECT_NE(topo.ibDevices.empty(), topo.ibStatus.empty());
}

TEST(Topology, RemoteKindsHaveNames) {
  EXPECT_STREQ(toString(NvlinkRemote::Switch), "NVSwitch");
  EXPECT_STREQ(toString(NvlinkRemote::Gpu), "GPU");
}

}  // namespace
}  // namespace ferry
