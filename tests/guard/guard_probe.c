// guard_probe MODE LIBFAKECUDA: reaches the fake driver's cuMulticastCreate one way (MODE) and calls
// it, or checks that harmless lookups still work. Run by expect_probe.sh with and without the guard.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*MulticastCreateFn)(unsigned long long*, const void*);
typedef int (*DriverGetVersionFn)(int*);
typedef int (*GetProcAddressV1)(const char*, void**, int, unsigned long long);
typedef int (*GetProcAddressV2)(const char*, void**, int, unsigned long long, int*);

static int fail(const char* what) {
  fprintf(stderr, "guard_probe: %s\n", what);
  return 2;
}

static int callMulticast(void* fn) {
  if (!fn) return fail("cuMulticastCreate not found");
  unsigned long long handle = 0;
  int result = ((MulticastCreateFn)fn)(&handle, NULL);
  printf("cuMulticastCreate returned %d\n", result);
  return result == 0 ? 0 : 3;
}

static void* viaV2(void* driver, const char* symbol) {
  GetProcAddressV2 gpa = (GetProcAddressV2)dlsym(driver, "cuGetProcAddress_v2");
  void* fn = NULL;
  int status = -1;
  if (!gpa || gpa(symbol, &fn, 13000, 0, &status) != 0) return NULL;
  return fn;
}

int main(int argc, char** argv) {
  if (argc != 3)
    return fail("usage: guard_probe dlsym|getproc_v1|getproc_v2|getproc_self|harmless|rtld_next LIBFAKECUDA");
  const char* mode = argv[1];
  void* driver = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!driver) return fail(dlerror());

  if (strcmp(mode, "dlsym") == 0) return callMulticast(dlsym(driver, "cuMulticastCreate"));
  if (strcmp(mode, "getproc_v2") == 0) return callMulticast(viaV2(driver, "cuMulticastCreate"));
  if (strcmp(mode, "getproc_v1") == 0) {
    GetProcAddressV1 gpa = (GetProcAddressV1)dlsym(driver, "cuGetProcAddress");
    void* fn = NULL;
    if (!gpa || gpa("cuMulticastCreate", &fn, 11030, 0) != 0) return fail("cuGetProcAddress failed");
    return callMulticast(fn);
  }
  if (strcmp(mode, "getproc_self") == 0) {
    // How the CUDA runtime works: ask cuGetProcAddress for the newest cuGetProcAddress, use that.
    GetProcAddressV2 gpa = (GetProcAddressV2)viaV2(driver, "cuGetProcAddress");
    void* fn = NULL;
    int status = -1;
    if (!gpa || gpa("cuMulticastCreate", &fn, 13000, 0, &status) != 0) return fail("nested lookup failed");
    return callMulticast(fn);
  }
  if (strcmp(mode, "harmless") == 0) {
    int direct = 0, viaProc = 0;
    DriverGetVersionFn byDlsym = (DriverGetVersionFn)dlsym(driver, "cuDriverGetVersion");
    DriverGetVersionFn byProc = (DriverGetVersionFn)viaV2(driver, "cuDriverGetVersion");
    if (!byDlsym || !byProc) return fail("cuDriverGetVersion not found");
    if (byDlsym(&direct) != 0 || byProc(&viaProc) != 0 || direct != 13000 || viaProc != 13000)
      return fail("cuDriverGetVersion gave a wrong answer");
    if (dlsym(driver, "cuNoSuchFunction") || dlsym(driver, "cuMulticastNoSuchFunction"))
      return fail("a missing symbol was found");
    printf("harmless calls ok: version %d\n", direct);
    return 0;
  }
  if (strcmp(mode, "rtld_next") == 0) {
    // glibc resolves RTLD_NEXT relative to dlsym's caller; the guard must keep that caller (us).
    Dl_info info;
    void* next = dlsym(RTLD_NEXT, "dlsym");
    if (!next || !dladdr(next, &info)) return fail("dlsym(RTLD_NEXT, \"dlsym\") failed");
    printf("RTLD_NEXT dlsym from %s\n", info.dli_fname);
    return 0;
  }
  return fail("unknown mode");
}
