// libfakecuda.so: just enough of a CUDA driver to test the guard without a GPU. Its
// cuGetProcAddress functions return pointers to *internal* functions, as the real driver does, so
// that only the guard's cuGetProcAddress wrapper (not symbol interposition) can stop them.
#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static int multicastCreate(unsigned long long* handle, const void* prop) {
  (void)prop;
  if (handle) *handle = 42;
  printf("fake driver: cuMulticastCreate ran\n");
  fflush(stdout);
  return 0;
}

static int driverGetVersion(int* version) {
  *version = 13000;
  return 0;
}

static int getProcAddressV2(const char* symbol, void** pfn, int cudaVersion, unsigned long long flags,
                            int* status);

// Names resolve to internal functions; anything else is "not found" (CUDA_ERROR_NOT_FOUND).
static int lookup(const char* symbol, void** pfn) {
  if (strcmp(symbol, "cuMulticastCreate") == 0)
    *pfn = (void*)multicastCreate;
  else if (strcmp(symbol, "cuDriverGetVersion") == 0)
    *pfn = (void*)driverGetVersion;
  else if (strcmp(symbol, "cuGetProcAddress") == 0)
    *pfn = (void*)getProcAddressV2;
  else
    *pfn = NULL;
  return *pfn ? 0 : 500;
}

static int getProcAddressV2(const char* symbol, void** pfn, int cudaVersion, unsigned long long flags,
                            int* status) {
  (void)cudaVersion;
  (void)flags;
  int result = lookup(symbol, pfn);
  if (status) *status = result == 0 ? 0 : 1;
  return result;
}

EXPORT int cuMulticastCreate(unsigned long long* handle, const void* prop) {
  return multicastCreate(handle, prop);
}
EXPORT int cuDriverGetVersion(int* version) { return driverGetVersion(version); }
EXPORT int cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, unsigned long long flags) {
  (void)cudaVersion;
  (void)flags;
  return lookup(symbol, pfn);
}
EXPORT int cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, unsigned long long flags,
                               int* status) {
  return getProcAddressV2(symbol, pfn, cudaVersion, flags, status);
}
