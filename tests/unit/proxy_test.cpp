// The proxy over a host-memory FIFO with host threads as producers: every trigger handled exactly
// once and in per-producer order, sync() meaning "handled", Stop, a throwing handler (logged,
// observable, rethrown), start/stop misuse, and pinning to a NUMA node's CPUs.
#include "ferry/proxy.hpp"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/logger.hpp"
#include "expect_contains.hpp"
#include "ferry/errors.hpp"
#include "fifo_test_util.hpp"
#include "platform/cpu_affinity.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;

ProxyOptions hostProxy(int size, std::chrono::nanoseconds timeout = 30s) {
  ProxyOptions o;
  o.fifo.size = size;
  o.fifo.memory = FifoMemory::Host;
  o.fifo.timeout = timeout;
  return o;
}

// Collects log lines for the duration of a test.
class LogCapture {
 public:
  LogCapture() {
    log::Levels levels;
    levels.fill(LogLevel::Info);
    log::setLevelsForTesting(levels);
    log::setSinkForTesting([this](std::string_view line) {
      std::lock_guard<std::mutex> lock(mu_);
      text_ += std::string(line) + "\n";
    });
  }
  ~LogCapture() {
    log::setSinkForTesting(nullptr);
    log::Levels levels;
    levels.fill(LogLevel::Warn);
    log::setLevelsForTesting(levels);
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }

 private:
  std::mutex mu_;
  std::string text_;
};

TEST(Proxy, ManyProducersEveryTriggerHandledOnceInOrder) {
  constexpr int kProducers = 8;
  const int perProducer = testing::scaledCount(100'000);
  testing::TriggerChecker checker(kProducers, perProducer);  // used on the proxy thread only
  std::uint64_t handled = 0;
  Proxy proxy(
      [&](ProxyTrigger t) {
        checker.check(t);
        ++handled;
        return ProxyHandlerResult::Continue;
      },
      hostProxy(16));
  proxy.start();
  EXPECT_TRUE(proxy.running());
  FifoDeviceHandle h = proxy.fifo().deviceHandle();
  std::vector<std::thread> producers;
  std::vector<std::uint64_t> lastSlot(kProducers);
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([&, p] {
      for (int i = 0; i < perProducer; ++i) lastSlot[p] = h.push(testing::makeTrigger(p, i));
      h.sync(lastSlot[p]);
    });
  for (auto& t : producers) t.join();
  // Every producer's last trigger is handled; the others came before it in the FIFO. sync() made
  // sure of the handling; stop() joins, so reading the checker below is race free.
  proxy.stop();
  EXPECT_EQ(handled, std::uint64_t(kProducers) * perProducer);
  checker.expectComplete();
  EXPECT_EQ(proxy.error(), nullptr);
}

// sync(slot) returns only after the handler ran for that slot: the handler records each producer's
// last handled sequence number, and the producer checks it right after sync. Every 16th trigger the
// handler sleeps a little, to widen the window in which a too-early pop would be caught.
TEST(Proxy, SyncReturnsOnlyAfterTheHandlerRan) {
  constexpr int kProducers = 4;
  const int perProducer = testing::scaledCount(2'000);
  std::vector<std::atomic<int>> lastHandled(kProducers);
  for (auto& v : lastHandled) v = -1;
  Proxy proxy(
      [&](ProxyTrigger t) {
        if ((testing::seqOf(t) & 15) == 0) std::this_thread::sleep_for(50us);
        lastHandled[testing::producerOf(t)].store(testing::seqOf(t), std::memory_order_relaxed);
        return ProxyHandlerResult::Continue;
      },
      hostProxy(8));
  proxy.start();
  FifoDeviceHandle h = proxy.fifo().deviceHandle();
  std::atomic<int> early{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([&, p] {
      for (int i = 0; i < perProducer; ++i) {
        h.sync(h.push(testing::makeTrigger(p, i)));
        // Relaxed is enough: sync's acquire load of the tail synchronizes with pop's release store,
        // which comes after the handler's store.
        if (lastHandled[p].load(std::memory_order_relaxed) != i) ++early;
      }
    });
  for (auto& t : producers) t.join();
  proxy.stop();
  EXPECT_EQ(early.load(), 0) << "sync() returned before the handler ran";
  for (int p = 0; p < kProducers; ++p) EXPECT_EQ(lastHandled[p].load(), perProducer - 1);
}

// With idleSleep set, a proxy left idle dozes instead of spinning (it stops using a core), and a
// trigger pushed while it dozes is still handled.
TEST(Proxy, DozesWhenIdleAndWakesForTheNextTrigger) {
  std::atomic<int> handled{0};
  ProxyOptions options = hostProxy(8);
  options.idleAfter = 1ms;
  options.idleSleep = 20us;
  Proxy proxy(
      [&](ProxyTrigger) {
        ++handled;
        return ProxyHandlerResult::Continue;
      },
      options);
  const auto cpuSeconds = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
  };
  proxy.start();
  FifoDeviceHandle h = proxy.fifo().deviceHandle();
  h.sync(h.push(testing::makeTrigger(0, 0)));
  std::this_thread::sleep_for(50ms);  // past idleAfter: dozing from here on
  const double before = cpuSeconds();
  std::this_thread::sleep_for(400ms);
  const double used = cpuSeconds() - before;
  h.sync(h.push(testing::makeTrigger(0, 1)));
  proxy.stop();
  EXPECT_EQ(handled.load(), 2);
  // A spinning proxy would use the whole 0.4 s; a dozing one wakes every ~20-100 us for a poll.
  EXPECT_LT(used, 0.2) << "the idle proxy used " << used << " s of CPU in 0.4 s";
}

// onPoll runs on the proxy thread between triggers and while idle (for work a handler left in
// progress); what it throws stops the proxy like a handler error.
TEST(Proxy, OnPollRunsWhileIdleAndItsErrorStopsTheProxy) {
  std::atomic<int> polls{0};
  std::atomic<bool> fail{false};
  ProxyOptions options = hostProxy(8);
  options.onPoll = [&] {
    ++polls;
    if (fail) throw std::runtime_error("planted");
  };
  Proxy proxy([](ProxyTrigger) { return ProxyHandlerResult::Continue; }, options);
  proxy.start();
  FifoDeviceHandle h = proxy.fifo().deviceHandle();
  h.sync(h.push(testing::makeTrigger(0, 0)));
  const int before = polls.load();
  std::this_thread::sleep_for(20ms);
  EXPECT_GT(polls.load(), before) << "onPoll did not run while the FIFO was empty";
  fail = true;
  for (int i = 0; i < 2000 && proxy.running(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_FALSE(proxy.running());
  EXPECT_THROW(proxy.stop(), std::runtime_error);
}

TEST(Proxy, StopResultEndsTheThreadAfterPoppingThatTrigger) {
  std::vector<std::uint64_t> seen;
  Proxy proxy(
      [&](ProxyTrigger t) {
        seen.push_back(t.fst);
        return t.fst == 2 ? ProxyHandlerResult::Stop : ProxyHandlerResult::Continue;
      },
      hostProxy(8));
  FifoDeviceHandle h = proxy.fifo().deviceHandle();
  for (std::uint64_t i = 1; i <= 4; ++i) h.push({i, 0});
  proxy.start();
  h.sync(1);  // slot 1 holds fst 2: popped after the handler returned Stop
  for (int i = 0; i < 1000 && proxy.running(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_FALSE(proxy.running());
  proxy.stop();  // joins; nothing to rethrow
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{1, 2}));
  // The triggers after Stop are still there, in order.
  EXPECT_EQ(proxy.fifo().tail(), 2u);
  auto t = proxy.fifo().poll();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->fst, 3u);
  // Starting again handles the rest.
  seen.clear();
  proxy.start();
  h.sync(3);
  proxy.stop();
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{3, 4}));
}

TEST(Proxy, AThrowingHandlerIsLoggedObservableAndRethrownByStop) {
  LogCapture logs;
  ProxyOptions o = hostProxy(8);
  o.fifo.rank = 5;
  Proxy proxy(
      [&](ProxyTrigger t) {
        if (t.fst == 0xbad) throw std::runtime_error("cannot handle this trigger");
        return ProxyHandlerResult::Continue;
      },
      o);
  proxy.start();
  FifoDeviceHandle h = proxy.fifo().deviceHandle();
  h.sync(h.push({1, 0}));
  const std::uint64_t bad = h.push({0xbad, 0x5eed});
  for (int i = 0; i < 2000 && proxy.running(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_FALSE(proxy.running()) << "the proxy kept running after its handler threw";
  ASSERT_NE(proxy.error(), nullptr);
  const std::string log = logs.text();
  EXPECT_CONTAINS(log, "rank 5 device -1");
  EXPECT_CONTAINS(log, "handler threw on slot 1 (fst 0xbad, snd 0x5eed)");
  EXPECT_CONTAINS(log, "cannot handle this trigger");
  // The failed trigger was not popped: a producer syncing on it must not believe it was handled.
  EXPECT_EQ(proxy.fifo().tail(), bad);
  try {
    proxy.stop();
    ADD_FAILURE() << "stop() did not rethrow the handler's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "cannot handle this trigger");
  }
  EXPECT_NO_THROW(proxy.stop());      // rethrown once
  EXPECT_NE(proxy.error(), nullptr);  // still observable
}

TEST(Proxy, DestructorAfterAHandlerErrorDoesNotThrow) {
  LogCapture logs;  // keeps the expected ERROR line out of the test output
  auto proxy = std::make_unique<Proxy>([](ProxyTrigger) -> ProxyHandlerResult { throw 42; }, hostProxy(4));
  proxy->start();
  proxy->fifo().deviceHandle().push({1, 1});
  for (int i = 0; i < 2000 && proxy->running(); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_CONTAINS(logs.text(), "an exception not derived from std::exception");
  EXPECT_NO_THROW(proxy.reset());
}

TEST(Proxy, Misuse) {
  EXPECT_THROW(Proxy(ProxyHandler{}, hostProxy(4)), Error);
  ProxyOptions bad = hostProxy(3);
  EXPECT_THROW(Proxy([](ProxyTrigger) { return ProxyHandlerResult::Continue; }, bad), Error);

  std::atomic<Proxy*> self{nullptr};
  Proxy proxy(
      [&](ProxyTrigger) {
        self.load()->stop();  // wrong: throws InvalidUsage, which becomes the handler's error
        return ProxyHandlerResult::Continue;
      },
      hostProxy(4));
  self = &proxy;
  EXPECT_NO_THROW(proxy.stop());  // not started: a no-op
  proxy.start();
  try {
    proxy.start();
    ADD_FAILURE() << "a second start() was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
  }
  LogCapture logs;
  proxy.fifo().deviceHandle().push({1, 1});
  for (int i = 0; i < 2000 && proxy.running(); ++i) std::this_thread::sleep_for(1ms);
  try {
    proxy.stop();
    ADD_FAILURE() << "stop() from the handler was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidUsage);
    EXPECT_CONTAINS(e.what(), "return ProxyHandlerResult::Stop instead");
  }
}

TEST(Proxy, PinsItsThreadToTheCpusOfTheNumaNode) {
  const std::vector<int> node0 = numaNodeCpus(0);
  if (node0.empty()) GTEST_SKIP() << "no /sys/devices/system/node/node0/cpulist";
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  std::vector<int> expected;
  for (int cpu : node0)
    if (CPU_ISSET(cpu, &allowed)) expected.push_back(cpu);
  if (expected.empty()) GTEST_SKIP() << "no CPU of node 0 is allowed to this process";

  LogCapture logs;
  ProxyOptions o = hostProxy(4);
  o.numaNode = 0;
  std::vector<int> seen;
  Proxy proxy(
      [&](ProxyTrigger) {
        cpu_set_t set;
        CPU_ZERO(&set);
        if (sched_getaffinity(0, sizeof(set), &set) == 0)
          for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
            if (CPU_ISSET(cpu, &set)) seen.push_back(cpu);
        return ProxyHandlerResult::Stop;
      },
      o);
  proxy.start();
  proxy.fifo().deviceHandle().sync(proxy.fifo().deviceHandle().push({1, 1}));
  proxy.stop();
  EXPECT_EQ(seen, expected);
  EXPECT_CONTAINS(logs.text(), "pinned to CPUs " + formatCpuList(expected) + " (NUMA node 0)");
}

TEST(Proxy, AnUnknownNumaNodeIsAWarningNotAnError) {
  LogCapture logs;
  ProxyOptions o = hostProxy(4);
  o.numaNode = 4095;
  Proxy proxy([](ProxyTrigger) { return ProxyHandlerResult::Continue; }, o);
  proxy.start();
  FifoDeviceHandle h = proxy.fifo().deviceHandle();
  h.sync(h.push({1, 1}));  // still works
  proxy.stop();
  EXPECT_CONTAINS(logs.text(), "WARN");
  EXPECT_CONTAINS(logs.text(), "NUMA node 4095");
  EXPECT_CONTAINS(logs.text(), "not pinned");
}

struct CpuListCase {
  const char* text;
  std::vector<int> cpus;
};

class CpuList : public ::testing::TestWithParam<CpuListCase> {};

TEST_P(CpuList, Parses) {
  auto cpus = parseCpuList(GetParam().text);
  ASSERT_TRUE(cpus) << GetParam().text;
  EXPECT_EQ(*cpus, GetParam().cpus);
  if (!cpus->empty()) {
    auto again = parseCpuList(formatCpuList(*cpus));
    ASSERT_TRUE(again);
    EXPECT_EQ(*again, *cpus);
  }
}
INSTANTIATE_TEST_SUITE_P(Lists, CpuList,
                         ::testing::Values(CpuListCase{"", {}}, CpuListCase{"\n", {}}, CpuListCase{"5", {5}},
                                           CpuListCase{"0-3\n", {0, 1, 2, 3}},
                                           CpuListCase{"0-1,8-9", {0, 1, 8, 9}},
                                           CpuListCase{"4,2,2-3", {2, 3, 4}}));

TEST(CpuList, MalformedIsNullopt) {
  for (const char* text : {"a", "1-", "-1", "3-1", "1,,2", "1,", "1 2", "0-99999", "1-2-3"})
    EXPECT_FALSE(parseCpuList(text)) << "'" << text << "' was accepted";
  EXPECT_EQ(formatCpuList({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
}

}  // namespace
}  // namespace ferry
