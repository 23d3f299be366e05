// gpu_guard_driver: on a machine with the NVIDIA driver, run under libferry_guard.so, every route to
// the real driver's cuMulticastCreate must hand out the guard's stub, and ordinary entry points
// must still work. It compares addresses only; it never calls a multicast function.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

namespace {

using GetProcAddressV2 = int (*)(const char*, void**, int, unsigned long long, int*);
using DriverGetVersionFn = int (*)(int*);

int failures = 0;

void expectGuardStub(const char* route, void* fn) {
  Dl_info info{};
  const bool fromGuard =
      fn && dladdr(fn, &info) && info.dli_fname && std::strstr(info.dli_fname, "libferry_guard") != nullptr;
  std::printf("%-55s %s (%s)\n", route, fromGuard ? "guard stub" : "NOT GUARDED",
              fn ? (info.dli_fname ? info.dli_fname : "?") : "null");
  if (!fromGuard) ++failures;
}

}  // namespace

int main() {
  int driverVersion = 0;
  if (cudaDriverGetVersion(&driverVersion) != cudaSuccess || driverVersion == 0) {
    std::printf("gpu_guard_driver: no NVIDIA driver; this test needs one\n");
    return 1;
  }

  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  cudaError_t err =
      cudaGetDriverEntryPointByVersion("cuMulticastCreate", &fn, 12010, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess) {
    std::printf("cudaGetDriverEntryPointByVersion(cuMulticastCreate) failed: %s\n", cudaGetErrorString(err));
    return 1;
  }
  expectGuardStub("cudaGetDriverEntryPointByVersion(cuMulticastCreate)", fn);

  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!driver) {
    std::printf("dlopen(libcuda.so.1) failed: %s\n", dlerror());
    return 1;
  }
  expectGuardStub("dlsym(libcuda, cuMulticastBindMem)", dlsym(driver, "cuMulticastBindMem"));
  auto gpa = reinterpret_cast<GetProcAddressV2>(dlsym(driver, "cuGetProcAddress_v2"));
  fn = nullptr;
  int found = -1;
  if (!gpa || gpa("cuMulticastCreate", &fn, 12010, 0, &found) != 0) {
    std::printf("cuGetProcAddress_v2(cuMulticastCreate) failed\n");
    return 1;
  }
  expectGuardStub("dlsym(libcuda, cuGetProcAddress_v2)(cuMulticastCreate)", fn);

  // Ordinary entry points still reach the driver.
  fn = nullptr;
  err = cudaGetDriverEntryPointByVersion("cuDriverGetVersion", &fn, 12000, cudaEnableDefault, &status);
  int viaEntryPoint = 0;
  if (err != cudaSuccess || !fn || reinterpret_cast<DriverGetVersionFn>(fn)(&viaEntryPoint) != 0 ||
      viaEntryPoint != driverVersion) {
    std::printf("cuDriverGetVersion through cudaGetDriverEntryPointByVersion: got %d, want %d\n",
                viaEntryPoint, driverVersion);
    ++failures;
  }
  std::printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
