#pragma once
// Helpers for GPU tests: checked CUDA calls that fail the test (not abort), device buffers that
// free themselves, random data, and what a kernel printed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#define GPU_CHECK(call)                                                                                   \
  do {                                                                                                    \
    cudaError_t e_ = (call);                                                                              \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
  } while (0)

namespace ferry::test {

inline int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// cudaMalloc'd memory on one device, zeroed, freed on destruction.
struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  int device = 0;
  DeviceBuffer(int dev, std::size_t n) : bytes(n), device(dev) {
    cudaSetDevice(dev);
    if (cudaMalloc(&ptr, n) != cudaSuccess) ptr = nullptr;
    if (ptr) cudaMemset(ptr, 0, n);
    cudaDeviceSynchronize();  // (a memset is asynchronous; other streams and devices are not ordered after it)
  }
  ~DeviceBuffer() {
    if (ptr) {
      cudaSetDevice(device);
      cudaFree(ptr);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T = void>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

inline std::vector<unsigned char> randomBytes(std::size_t n, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<unsigned char>(rng());
  return v;
}

// Runs f() with this process's stdout, where a kernel's printf goes (at the next synchronization,
// which f must include), sent to a file, and returns what was written there.
template <class F>
std::string capturingStdout(F&& f) {
  char path[] = "/tmp/ferry-stdout-XXXXXX";
  const int out = mkstemp(path);
  std::fflush(stdout);
  const int saved = dup(1);
  dup2(out, 1);
  f();
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);
  close(out);
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::remove(path);
  return text.str();
}

}  // namespace ferry::test
