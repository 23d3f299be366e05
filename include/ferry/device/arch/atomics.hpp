#pragma once
// Every atomic in ferry's device code goes through these wrappers, so each names its scope and
// memory order (STYLE.md habit 3). They compile for the GPU and for the host (libcu++'s
// cuda::atomic_ref works in both), which lets host threads stand in for GPU threads in tests.
//
// Scope: System covers peers reached over NVLink/PCIe and the host (the proxy); Device covers the
// threads of one GPU.
#include <cuda/atomic>

#include "ferry/device/macros.hpp"

namespace ferry {

using cuda::memory_order_acq_rel;
using cuda::memory_order_acquire;
using cuda::memory_order_relaxed;
using cuda::memory_order_release;
using cuda::memory_order_seq_cst;

template <class T, cuda::thread_scope Scope = cuda::thread_scope_system>
FERRY_HOST_DEVICE FERRY_INLINE T atomicLoad(const T* ptr, cuda::memory_order order) {
  return cuda::atomic_ref<T, Scope>(*const_cast<T*>(ptr)).load(order);
}

template <class T, cuda::thread_scope Scope = cuda::thread_scope_system>
FERRY_HOST_DEVICE FERRY_INLINE void atomicStore(T* ptr, T value, cuda::memory_order order) {
  cuda::atomic_ref<T, Scope>(*ptr).store(value, order);
}

template <class T, cuda::thread_scope Scope = cuda::thread_scope_system>
FERRY_HOST_DEVICE FERRY_INLINE T atomicFetchAdd(T* ptr, T value, cuda::memory_order order) {
  return cuda::atomic_ref<T, Scope>(*ptr).fetch_add(value, order);
}

// True when *ptr held `expected` and now holds `desired`.
template <class T, cuda::thread_scope Scope = cuda::thread_scope_system>
FERRY_HOST_DEVICE FERRY_INLINE bool atomicCompareExchange(T* ptr, T expected, T desired, cuda::memory_order order) {
  return cuda::atomic_ref<T, Scope>(*ptr).compare_exchange_strong(expected, desired, order);
}

template <cuda::thread_scope Scope = cuda::thread_scope_system>
FERRY_HOST_DEVICE FERRY_INLINE void atomicFence(cuda::memory_order order) {
  cuda::atomic_thread_fence(order, Scope);
}

}  // namespace ferry
