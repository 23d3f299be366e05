#include "ferry/proxy.hpp"

#include <cuda_runtime_api.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "core/logger.hpp"
#include "ferry/errors.hpp"
#include "platform/cpu_affinity.hpp"
#include "core/text.hpp"

namespace ferry {
namespace {

// One cheap spin-wait hint: lets the sibling hyperthread run and saves power without leaving the
// core (tens of cycles, far below a PCIe write's latency).
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  std::this_thread::yield();
#endif
}

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

thread_local const void* currentProxy = nullptr;  // a proxy thread's own Proxy::Impl

}  // namespace

struct Proxy::Impl {
  ProxyHandler handler;
  ProxyOptions options;
  Fifo fifo;
  std::thread thread;
  std::atomic<bool> stopRequested{false};
  std::atomic<bool> running{false};
  mutable std::mutex mu;
  std::exception_ptr error;    // guarded by mu
  bool errorRethrown = false;  // guarded by mu

  Impl(ProxyHandler h, const ProxyOptions& o) : handler(std::move(h)), options(o), fifo(o.fifo) {
    if (!handler) throw Error(ErrorCode::InvalidUsage, "Proxy: the handler is empty");
  }

  std::string who() const {
    return "rank " + std::to_string(options.fifo.rank) + " device " + std::to_string(fifo.device());
  }

  void fail(std::exception_ptr e, const std::string& what) {
    FERRY_LOG(Error, Proxy) << "proxy of " << who() << ": " << what << ": " << describe(e)
                            << "; the proxy stopped (Proxy::error(), rethrown by Proxy::stop())";
    {
      std::lock_guard<std::mutex> lock(mu);
      error = std::move(e);
    }
    if (options.onFailure) {
      try {
        options.onFailure();
      } catch (const std::exception& x) {
        FERRY_LOG(Error, Proxy) << "proxy of " << who() << ": onFailure threw: " << x.what();
      }
    }
  }

  void pin(int device) {
    int node = options.numaNode ? *options.numaNode : (device >= 0 ? gpuNumaNode(device) : -1);
    if (node < 0) {
      if (device >= 0) FERRY_LOG(Info, Proxy) << "proxy of " << who() << ": NUMA node unknown, not pinned";
      return;
    }
    std::vector<int> cpus = numaNodeCpus(node);
    if (cpus.empty()) {
      FERRY_LOG(Warn, Proxy) << "proxy of " << who() << ": cannot read the CPUs of NUMA node " << node
                             << " (/sys/devices/system/node/node" << node << "/cpulist); not pinned";
      return;
    }
    std::string why;
    std::vector<int> pinned = pinCallingThread(cpus, why);
    if (pinned.empty())
      FERRY_LOG(Warn, Proxy) << "proxy of " << who() << ": not pinned to NUMA node " << node << ": " << why;
    else
      FERRY_LOG(Info, Proxy) << "proxy of " << who() << ": pinned to CPUs " << formatCpuList(pinned)
                             << " (NUMA node " << node << ")";
  }

  void run() {
    currentProxy = this;
    const int device = fifo.device();
    log::setDevice(device);
    pthread_setname_np(pthread_self(), "ferry-proxy");
    if (device >= 0) {
      if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
        fail(
            std::make_exception_ptr(CudaError(std::string("cudaSetDevice: ") + cudaGetErrorString(err), err)),
            "thread start");
        running.store(false);
        return;
      }
    }
    pin(device);
    std::uint32_t idle = 0;
    bool dozing = false;  // idle for options.idleAfter: sleeping between polls
    std::chrono::steady_clock::time_point idleSince;
    while (!stopRequested.load(std::memory_order_relaxed)) {
      if (options.onPoll) {
        try {
          options.onPoll();
        } catch (...) {
          fail(std::current_exception(), "onPoll threw");
          break;
        }
      }
      std::optional<ProxyTrigger> trigger = fifo.poll();
      if (!trigger) {
        if (dozing) {
          std::this_thread::sleep_for(options.idleSleep);
          continue;
        }
        cpuRelax();
        if ((++idle & 1023) == 0) {
          std::this_thread::yield();
          if (options.idleSleep.count() > 0) {
            const auto now = std::chrono::steady_clock::now();
            if (idle == 1024) idleSince = now;
            dozing = now - idleSince >= options.idleAfter;
          }
        }
        continue;
      }
      idle = 0;
      dozing = false;
      ProxyHandlerResult result;
      try {
        result = handler(*trigger);
      } catch (...) {
        fail(std::current_exception(), "handler threw on slot " + std::to_string(fifo.tail()) + " (fst " +
                                           hexString(trigger->fst) + ", snd " + hexString(trigger->snd) + ")");
        break;
      }
      fifo.pop();  // after the handler: sync(slot) on the producer side means "handled"
      if (result == ProxyHandlerResult::Stop) break;
    }
    running.store(false);
  }
};

Proxy::Proxy(ProxyHandler handler, const ProxyOptions& options)
    : impl_(std::make_unique<Impl>(std::move(handler), options)) {}

Proxy::~Proxy() {
  try {
    stop();
  } catch (const std::exception& e) {
    FERRY_LOG(Debug, Proxy) << "Proxy destroyed with a handler error stop() did not rethrow: " << e.what();
  } catch (...) {
  }
}

void Proxy::start() {
  if (impl_->running.load())
    throw Error(ErrorCode::InvalidUsage, "Proxy::start: the proxy is already running");
  if (impl_->thread.joinable()) impl_->thread.join();  // ended by itself (Stop or a handler error)
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->error = nullptr;
    impl_->errorRethrown = false;
  }
  impl_->stopRequested.store(false);
  impl_->running.store(true);
  try {
    impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
  } catch (...) {
    impl_->running.store(false);
    throw;
  }
}

void Proxy::stop() {
  if (impl_->thread.joinable()) {
    if (currentProxy == impl_.get())
      throw Error(ErrorCode::InvalidUsage,
                  "Proxy::stop called from the proxy's handler (return ProxyHandlerResult::Stop instead)");
    impl_->stopRequested.store(true);
    impl_->thread.join();
  }
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->error && !impl_->errorRethrown) {
      impl_->errorRethrown = true;
      e = impl_->error;
    }
  }
  if (e) std::rethrow_exception(e);
}

bool Proxy::running() const { return impl_->running.load(); }

std::exception_ptr Proxy::error() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->error;
}

Fifo& Proxy::fifo() { return impl_->fifo; }

}  // namespace ferry
