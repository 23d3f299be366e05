#pragma once
// The proxy: a host thread that drains a Fifo (ferry/fifo.hpp) and calls a handler for each
// trigger, in slot order. PortChannel's proxy (copies, signals, flushes) is one handler; users can
// install their own, a custom proxy, as in the MSCCL++ README example:
//
//   // Host: the handler decides what a trigger means. Here fst = byte count, snd = offset.
//   ferry::Proxy proxy([&](ferry::ProxyTrigger t) {
//     if (t.fst == 0) return ferry::ProxyHandlerResult::Stop;         // a "quit" trigger
//     std::memcpy(dst + t.snd, src + t.snd, t.fst);
//     return ferry::ProxyHandlerResult::Continue;
//   }, {.fifo = {.memory = ferry::FifoMemory::Gpu, .device = 0}});
//   proxy.start();
//   myKernel<<<grid, block, 0, stream>>>(proxy.fifo().deviceHandle());
//   cudaStreamSynchronize(stream);
//   proxy.stop();  // joins the thread; rethrows what a handler threw
//
//   // Device: push a request; sync() returns once the handler has run for it.
//   __global__ void myKernel(ferry::FifoDeviceHandle fifo) {
//     if (threadIdx.x == 0) fifo.sync(fifo.push({/*fst=*/bytes, /*snd=*/offset}));
//   }
//
// Contract:
// - The handler runs on the proxy thread only, one trigger at a time, in slot order. The trigger is
//   popped after the handler returns, so a producer's sync(slot) means "handled", not "seen".
// - Stop ends the thread after popping that trigger. stop() does not drain: triggers still in the
//   FIFO stay there (a producer that sync()s on one times out, naming Fifo::sync).
// - A handler that throws ends the thread without popping its trigger: the error is logged (rank,
//   device), kept in error(), and rethrown by the next stop(). Producers waiting on that trigger
//   time out instead of believing it was handled.
// - The thread spins: after an empty poll it executes a CPU pause (x86 `pause`, Arm `yield`), which
//   keeps pickup latency in the sub-microsecond range but occupies one core while started. Every
//   1024 empty polls it also yields to the OS scheduler, which costs nothing when the core is free
//   and lets other threads run when the machine is oversubscribed. Stop the proxy when idle for long,
//   or set ProxyOptions::idleSleep to have it doze once idle.
// - The thread is pinned to the CPUs of the NUMA node nearest the GPU when that is known (INFO log
//   line; failure is a WARN), calls cudaSetDevice for a Gpu FIFO, and logs as that device.
// - Wrong: calling stop() from the handler (the thread cannot join itself; return Stop instead), or
//   touching fifo().poll()/pop() while the proxy runs (the proxy is the only consumer).
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ferry/api.hpp"
#include "ferry/fifo.hpp"

namespace ferry {

enum class ProxyHandlerResult { Continue, Stop };
using ProxyHandler = std::function<ProxyHandlerResult(ProxyTrigger)>;

struct ProxyOptions {
  FifoOptions fifo;  // the FIFO the proxy owns; a Gpu FIFO makes the thread serve fifo.device
  // NUMA node whose CPUs the thread is pinned to; unset: the GPU's node for a Gpu FIFO, none for a
  // Host FIFO.
  std::optional<int> numaNode;
  // Once the FIFO has been empty for idleAfter, the thread sleeps idleSleep between polls instead
  // of spinning, so an idle proxy stops occupying a core; the first trigger after such a pause
  // waits up to idleSleep longer. Zero idleSleep (the default): always spin.
  std::chrono::microseconds idleAfter{1000};
  std::chrono::microseconds idleSleep{0};
  // Called on the proxy thread after each handled trigger and on every empty poll, for work a
  // handler left in progress (a flush that completes later). It must not block; what it throws
  // stops the proxy like a handler's error.
  std::function<void()> onPoll;
  // Called once on the proxy thread when a handler or onPoll fails, after the error is recorded:
  // to tell whoever waits for the proxy's work that it will not come (HostPartners raises the word
  // its kernels' waits give up on). It must not block or throw.
  std::function<void()> onFailure;
};

class FERRY_API Proxy {
 public:
  // Creates the FIFO (see Fifo's errors); the thread starts with start().
  explicit Proxy(ProxyHandler handler, const ProxyOptions& options = {});
  // Stops the thread; a handler error not yet rethrown by stop() is logged, not thrown.
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Starts the thread. Throws Error(InvalidUsage) if it is already running. Starting again after
  // stop() is fine and forgets an earlier handler error.
  void start();
  // Asks the thread to end and joins it; a no-op when not running. Rethrows, once, the exception a
  // handler threw. Throws Error(InvalidUsage) when called from the handler.
  void stop();
  // True from start() until the thread ends (stop(), a Stop result, or a handler error).
  bool running() const;
  // What a handler threw (nullptr if nothing), kept until the next start().
  std::exception_ptr error() const;

  Fifo& fifo();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
