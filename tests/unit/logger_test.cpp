// The logger: FERRY_LOG spec parsing, level filtering per subsystem, the host:pid:tid [dev] prefix,
// and that a disabled FERRY_LOG line costs no evaluation of its arguments.
#include "core/logger.hpp"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "expect_contains.hpp"
#include "ferry/errors.hpp"

namespace ferry {
namespace {

constexpr LogSubsys kAllSubsys[] = {LogSubsys::Core,  LogSubsys::Bootstrap,   LogSubsys::Transport,
                                    LogSubsys::Proxy, LogSubsys::Collectives, LogSubsys::Executor,
                                    LogSubsys::Nccl,  LogSubsys::Tools};
constexpr LogLevel kAllLevels[] = {LogLevel::Error, LogLevel::Warn, LogLevel::Info, LogLevel::Debug,
                                   LogLevel::Trace};

log::Levels all(LogLevel level) {
  log::Levels l{};
  l.fill(level);
  return l;
}

int idx(LogSubsys s) { return static_cast<int>(s); }

TEST(LogSpec, EmptyMeansWarn) { EXPECT_EQ(log::parseSpec(""), all(LogLevel::Warn)); }

TEST(LogSpec, OneLevelForAll) {
  EXPECT_EQ(log::parseSpec("INFO"), all(LogLevel::Info));
  EXPECT_EQ(log::parseSpec("trace"), all(LogLevel::Trace));
  EXPECT_EQ(log::parseSpec("NONE"), all(LogLevel::None));
  EXPECT_EQ(log::parseSpec("off"), all(LogLevel::None));
  EXPECT_EQ(log::parseSpec("ERROR"), all(LogLevel::Error));
  EXPECT_EQ(log::parseSpec("warning"), all(LogLevel::Warn));
}

TEST(LogSpec, PerSubsystem) {
  log::Levels expected = all(LogLevel::Warn);
  expected[idx(LogSubsys::Bootstrap)] = LogLevel::Trace;
  EXPECT_EQ(log::parseSpec("WARN,TRACE:bootstrap"), expected);
  EXPECT_EQ(log::parseSpec(" WARN , TRACE:bootstrap "), expected);
}

TEST(LogSpec, LaterItemsWin) {
  log::Levels expected = all(LogLevel::Info);
  expected[idx(LogSubsys::Proxy)] = LogLevel::Debug;
  expected[idx(LogSubsys::Nccl)] = LogLevel::None;
  EXPECT_EQ(log::parseSpec("INFO,DEBUG:proxy,NONE:nccl"), expected);
  // A bare level after per-subsystem items resets all of them.
  EXPECT_EQ(log::parseSpec("DEBUG:proxy,INFO"), all(LogLevel::Info));
}

TEST(LogSpec, EverySubsystemNameParses) {
  for (LogSubsys s : kAllSubsys) {
    const std::string spec = "TRACE:" + std::string(log::name(s));
    log::Levels expected = all(LogLevel::Warn);
    expected[idx(s)] = LogLevel::Trace;
    EXPECT_EQ(log::parseSpec(spec), expected) << spec;
  }
}

struct BadSpec {
  const char* spec;
  const char* item;  // what the error must quote
};
class LogSpecBad : public ::testing::TestWithParam<BadSpec> {};

TEST_P(LogSpecBad, ThrowsInvalidUsageNamingTheItem) {
  try {
    log::parseSpec(GetParam().spec);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_CONTAINS(e.what(), "FERRY_LOG");
    EXPECT_CONTAINS(e.what(), std::string("'") + GetParam().item + "'");
    return;
  }
  FAIL() << "'" << GetParam().spec << "' was accepted";
}

INSTANTIATE_TEST_SUITE_P(Specs, LogSpecBad,
                         ::testing::Values(BadSpec{"LOUD", "LOUD"}, BadSpec{"INFO,VERBOSE", "VERBOSE"},
                                           BadSpec{"TRACE:bootstarp", "TRACE:bootstarp"},
                                           BadSpec{"WARN,INFO:gpu", "INFO:gpu"}, BadSpec{":core", ":core"},
                                           BadSpec{"INFO:", "INFO:"}));

// Captures what the logger writes and restores levels and sink afterwards.
class LoggerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (LogSubsys s : kAllSubsys) {
      saved_[idx(s)] = LogLevel::None;
      for (LogLevel l : kAllLevels)
        if (log::enabled(l, s)) saved_[idx(s)] = l;
    }
    log::setSinkForTesting([this](std::string_view line) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(line);
    });
  }
  void TearDown() override {
    log::setSinkForTesting(nullptr);
    log::setLevelsForTesting(saved_);
    log::setDevice(-1);
  }
  // Lines that contain marker (the logger may also write its startup lines through the sink).
  std::vector<std::string> linesWith(const std::string& marker) {
    std::lock_guard lock(mu_);
    std::vector<std::string> out;
    for (const auto& l : lines_)
      if (l.find(marker) != std::string::npos) out.push_back(l);
    return out;
  }

  std::mutex mu_;
  std::vector<std::string> lines_;
  log::Levels saved_{};
};

TEST_F(LoggerTest, EnabledHonoursLevelsPerSubsystem) {
  log::Levels levels = all(LogLevel::Warn);
  levels[idx(LogSubsys::Bootstrap)] = LogLevel::Trace;
  levels[idx(LogSubsys::Nccl)] = LogLevel::None;
  log::setLevelsForTesting(levels);
  for (LogSubsys s : kAllSubsys) {
    for (LogLevel l : kAllLevels) {
      EXPECT_EQ(log::enabled(l, s), static_cast<int>(l) <= static_cast<int>(levels[idx(s)]))
          << log::name(s) << " level " << static_cast<int>(l);
    }
  }
  EXPECT_TRUE(log::enabled(LogLevel::Trace, LogSubsys::Bootstrap));
  EXPECT_FALSE(log::enabled(LogLevel::Info, LogSubsys::Core));
  EXPECT_TRUE(log::enabled(LogLevel::Warn, LogSubsys::Core));
  EXPECT_FALSE(log::enabled(LogLevel::Error, LogSubsys::Nccl));
}

TEST_F(LoggerTest, DisabledLinesAreNotWritten) {
  log::setLevelsForTesting(all(LogLevel::Warn));
  FERRY_LOG(Info, Core) << "marker-info-dropped";
  FERRY_LOG(Warn, Core) << "marker-warn-kept";
  EXPECT_TRUE(linesWith("marker-info-dropped").empty());
  EXPECT_EQ(linesWith("marker-warn-kept").size(), 1u);
}

TEST_F(LoggerTest, LinePrefixIsHostPidTidDevice) {
  log::setLevelsForTesting(all(LogLevel::Info));
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  std::string shortHost(host);
  shortHost = shortHost.substr(0, shortHost.find('.'));
  const std::string pid = std::to_string(getpid());
  const std::string tid = std::to_string(static_cast<long>(syscall(SYS_gettid)));

  FERRY_LOG(Info, Bootstrap) << "marker-nodev " << 42;
  log::setDevice(3);
  FERRY_LOG(Warn, Transport) << "marker-dev3";

  auto nodev = linesWith("marker-nodev");
  ASSERT_EQ(nodev.size(), 1u);
  EXPECT_EQ(nodev[0], shortHost + ":" + pid + ":" + tid + " [-] ferry INFO bootstrap: marker-nodev 42");
  auto dev3 = linesWith("marker-dev3");
  ASSERT_EQ(dev3.size(), 1u);
  EXPECT_EQ(dev3[0], shortHost + ":" + pid + ":" + tid + " [3] ferry WARN transport: marker-dev3");
}

TEST_F(LoggerTest, DeviceIsPerThread) {
  log::setLevelsForTesting(all(LogLevel::Info));
  log::setDevice(5);
  std::string otherTid;
  std::thread t([&] {
    otherTid = std::to_string(static_cast<long>(syscall(SYS_gettid)));
    FERRY_LOG(Info, Core) << "marker-other-thread";
  });
  t.join();
  auto lines = linesWith("marker-other-thread");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_CONTAINS(lines[0], ":" + otherTid + " [-] ");
}

TEST_F(LoggerTest, DisabledMacroDoesNotEvaluateItsArguments) {
  log::setLevelsForTesting(all(LogLevel::Warn));
  int evaluated = 0;
  auto costly = [&] {
    ++evaluated;
    return "value";
  };
  FERRY_LOG(Debug, Core) << "marker-costly " << costly();
  FERRY_LOG(Trace, Bootstrap) << costly() << costly();
  EXPECT_EQ(evaluated, 0);
  EXPECT_TRUE(linesWith("marker-costly").empty());

  FERRY_LOG(Error, Core) << "marker-costly " << costly();
  EXPECT_EQ(evaluated, 1);
  EXPECT_EQ(linesWith("marker-costly").size(), 1u);
}

TEST_F(LoggerTest, MacroIsSafeInUnbracedIfElse) {
  log::setLevelsForTesting(all(LogLevel::Trace));
  int branch = 0;
  const bool condition = false;
  // The else must bind to `if (condition)`, not to an if inside the macro.
  // clang-format off
  if (condition) FERRY_LOG(Info, Core) << "marker-if-branch"; else branch = 2;
  // clang-format on
  EXPECT_EQ(branch, 2);
  EXPECT_TRUE(linesWith("marker-if-branch").empty());
}

}  // namespace
}  // namespace ferry
