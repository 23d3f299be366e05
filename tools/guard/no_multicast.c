// libferry_guard.so: preload it (LD_PRELOAD) and any cuMulticast* driver call aborts the process,
// with a line on stderr naming the call, before the driver sees it. NVLink multicast objects can
// take a shared machine's GPUs out of service for days (architecture.md rule 1); the env gate in ferry
// is the first guard, this library the second, for everything in the process (NCCL, PyTorch, us).
//
// Programs reach driver functions three ways, and each is covered:
//  1. calls bound at link time (-lcuda): the cuMulticast* functions below interpose them;
//  2. dlsym(libcuda handle, "cuMulticast...") : our dlsym returns the aborting stub instead;
//  3. cuGetProcAddress[_v2] (which cudaGetDriverEntryPoint[ByVersion] and the CUDA runtime itself
//     use): our dlsym hands out wrappers of those, and the wrappers swap any cuMulticast* result
//     for the stub. The wrappers also stand in when cuGetProcAddress is asked for itself.
// Looking a cuMulticast* symbol up is allowed (NCCL resolves every entry point at start-up);
// only calling it aborts.
//
// Not covered: dlvsym() on libcuda (it exports no versioned symbols, nobody does that) and
// cuGetExportTable (internal tables, no multicast entry in the public API).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GUARD_EXPORT __attribute__((visibility("default")))

// ---- the stubs --------------------------------------------------------------------------------

__attribute__((noreturn)) static void forbidden(const char* symbol) {
  // write(2), not stdio: no locks, no allocation, whatever state the process is in.
  static const char head[] = "ferry guard (libferry_guard.so): ";
  static const char tail[] =
      " called: NVLink multicast is forbidden on this machine (architecture.md rule 1); aborting\n";
  ssize_t ignored = write(2, head, sizeof(head) - 1);
  ignored = write(2, symbol, strlen(symbol));
  ignored = write(2, tail, sizeof(tail) - 1);
  (void)ignored;
  abort();
}

// The stubs never return, so the arguments they are called with do not matter (C calling
// convention: the caller owns the argument area). The names are every cuMulticast* entry point of
// cuda.h in CUDA 13.0; cuMulticastUnknown stands in for names added later.
#define GUARD_STUB(fn) \
  GUARD_EXPORT int fn(void) { forbidden(#fn); }
GUARD_STUB(cuMulticastCreate)
GUARD_STUB(cuMulticastAddDevice)
GUARD_STUB(cuMulticastBindMem)
GUARD_STUB(cuMulticastBindAddr)
GUARD_STUB(cuMulticastUnbind)
GUARD_STUB(cuMulticastGetGranularity)
static int cuMulticastUnknown(void) { forbidden("a cuMulticast* function (not listed in no_multicast.c)"); }

static const struct {
  const char* name;
  int (*stub)(void);
} kStubs[] = {
    {"cuMulticastCreate", cuMulticastCreate},   {"cuMulticastAddDevice", cuMulticastAddDevice},
    {"cuMulticastBindMem", cuMulticastBindMem}, {"cuMulticastBindAddr", cuMulticastBindAddr},
    {"cuMulticastUnbind", cuMulticastUnbind},   {"cuMulticastGetGranularity", cuMulticastGetGranularity},
};

static int isMulticast(const char* symbol) {
  return symbol && strncmp(symbol, "cuMulticast", strlen("cuMulticast")) == 0;
}

static void* stubFor(const char* symbol) {
  for (size_t i = 0; i < sizeof(kStubs) / sizeof(kStubs[0]); ++i)
    if (strcmp(symbol, kStubs[i].name) == 0) return (void*)kStubs[i].stub;
  return (void*)cuMulticastUnknown;
}

// ---- the real dlsym -----------------------------------------------------------------------------

typedef void* (*DlsymFn)(void*, const char*);

// dlsym cannot look itself up, so ask dlvsym for glibc's, under the version names glibc has used
// (2.34 merged libdl into libc). Several threads may race here; they all store the same value.
static DlsymFn realDlsym(void) {
  static DlsymFn real;
  DlsymFn fn = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
  if (!fn) {
    fn = (DlsymFn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!fn) fn = (DlsymFn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!fn) forbidden("dlsym (the guard cannot find glibc's dlsym, so it cannot guard)");
    __atomic_store_n(&real, fn, __ATOMIC_RELEASE);
  }
  return fn;
}

// ---- cuGetProcAddress wrappers --------------------------------------------------------------------

typedef unsigned long long cuuint64;  // cuuint64_t
typedef int (*GetProcAddressV1)(const char*, void**, int, cuuint64);
typedef int (*GetProcAddressV2)(const char*, void**, int, cuuint64, int*);
enum { kCudaErrorNotFound = 500, kProcAddressV2Since = 12000 };

// The driver's own functions: recorded when dlsym hands them out, else found after us in the
// search order (a program linked with -lcuda).
static void* realV1;
static void* realV2;

GUARD_EXPORT int cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64 flags);
GUARD_EXPORT int cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64 flags,
                                     int* symbolStatus);

static void* driverFunction(void** slot, const char* name) {
  void* fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (!fn) {
    fn = realDlsym()(RTLD_NEXT, name);
    if (fn) __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
  }
  return fn;
}

// Remembers the driver's function and returns our wrapper in its place. A pointer to the wrapper
// itself (dlsym found ours first) is not recorded: that would make the wrapper call itself.
static void* wrapGetProcAddress(void* real, int v2) {
  void* wrapper = v2 ? (void*)cuGetProcAddress_v2 : (void*)cuGetProcAddress;
  if (real && real != wrapper) __atomic_store_n(v2 ? &realV2 : &realV1, real, __ATOMIC_RELEASE);
  return real ? wrapper : NULL;
}

// What a cuGetProcAddress call handed back, made safe.
static void filterResult(const char* symbol, void** pfn, int cudaVersion) {
  if (!symbol || !pfn || !*pfn) return;
  if (isMulticast(symbol)) *pfn = stubFor(symbol);
  // Asked for itself: the 5-argument form is what CUDA >= 12.0 callers get.
  else if (strcmp(symbol, "cuGetProcAddress") == 0)
    *pfn = wrapGetProcAddress(*pfn, cudaVersion >= kProcAddressV2Since);
}

GUARD_EXPORT int cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64 flags) {
  GetProcAddressV1 real = (GetProcAddressV1)driverFunction(&realV1, "cuGetProcAddress");
  if (!real) return kCudaErrorNotFound;
  int result = real(symbol, pfn, cudaVersion, flags);
  filterResult(symbol, pfn, cudaVersion);
  return result;
}

GUARD_EXPORT int cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64 flags,
                                     int* symbolStatus) {
  GetProcAddressV2 real = (GetProcAddressV2)driverFunction(&realV2, "cuGetProcAddress_v2");
  if (!real) return kCudaErrorNotFound;
  int result = real(symbol, pfn, cudaVersion, flags, symbolStatus);
  filterResult(symbol, pfn, cudaVersion);
  return result;
}

// ---- dlsym --------------------------------------------------------------------------------------

// glibc's dlsym finds the object that called it from its return address (RTLD_NEXT and the
// namespace depend on it). Every name we do not care about is passed on as a tail call, so that
// glibc still sees the original caller: CMake builds this file with -O2 -foptimize-sibling-calls
// and tests/guard checks the RTLD_NEXT answer. Names we rewrite are looked up with the guard as
// the caller, which only matters for RTLD_NEXT lookups of driver symbols.
GUARD_EXPORT void* dlsym(void* handle, const char* symbol) {
  DlsymFn real = realDlsym();
  if (symbol[0] == 'c' && symbol[1] == 'u') {
    if (isMulticast(symbol)) return real(handle, symbol) ? stubFor(symbol) : NULL;
    if (strcmp(symbol, "cuGetProcAddress") == 0) return wrapGetProcAddress(real(handle, symbol), 0);
    if (strcmp(symbol, "cuGetProcAddress_v2") == 0) return wrapGetProcAddress(real(handle, symbol), 1);
  }
#if defined(__clang__) && __has_attribute(musttail)
  __attribute__((musttail))
#endif
  return real(handle, symbol);
}
