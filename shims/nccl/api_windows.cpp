// ncclCommWindowRegister / ncclCommWindowDeregister: NCCL 2.27's registration of a buffer as a
// window, natively on ferry's registration (as ncclCommRegister: collective, every rank registers
// its buffer of the same role in the same order; ferry's kernels then read and write the peers'
// buffers directly). NCCL_WIN_COLL_SYMMETRIC asks that of NCCL too; ferry needs no more for it. A
// forwarded comm hands both calls to the real NCCL, when it has them.
#include <cstdint>

#include "api_internal.hpp"
#include "checks.hpp"
#include "ferry/memory.hpp"
#include "results.hpp"

#define NCCL_API extern "C" __attribute__((visibility("default")))

// What an ncclWindow_t points to.
struct ncclWindow_vidmem {
  static constexpr std::uint64_t kAlive = 0x6665727279574e44ull;  // "ferryWND"
  std::uint64_t magic = kAlive;
  ncclComm* comm = nullptr;
  void* userPtr = nullptr;                 // the buffer registered (ncclWinGetUserPtr)
  ferry::BufferRegistration registration;  // native
  ncclWindow_t real = nullptr;             // forwarded: the real NCCL's window
};

using namespace ferry;
using namespace ferry::nccl;

NCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                             int winFlags) {
  return guarded("ncclCommWindowRegister", [&] {
    ncclComm& c = usable(comm);
    checkNotNull(win, "win");
    if (winFlags != NCCL_WIN_DEFAULT && winFlags != NCCL_WIN_COLL_SYMMETRIC)
      throw ApiError{ncclInvalidArgument, "winFlags " + std::to_string(winFlags) +
                                              " is neither NCCL_WIN_DEFAULT nor NCCL_WIN_COLL_SYMMETRIC"};
    auto w = std::make_unique<ncclWindow_vidmem>();
    w->comm = &c;
    w->userPtr = buff;
    if (const RealNccl* real = forwarded(c)) {
      if (real->commWindowRegister == nullptr)
        throw ApiError{ncclInvalidUsage, "the real NCCL (" + real->path + ") has no ncclCommWindowRegister"};
      realResult(c, real->commWindowRegister(c.real, buff, size, &w->real, winFlags));
    } else {
      checkNotNull(buff, "buff");
      if (size == 0) throw ApiError{ncclInvalidArgument, "size is 0"};
      w->registration = c.comm->registerBuffer(buff, size);  // collective
    }
    *win = w.release();
    return ncclSuccess;
  });
}

NCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return guarded("ncclCommWindowDeregister", [&] {
    ncclComm& c = usable(comm);
    checkNotNull(win, "win");
    if (win->magic != ncclWindow_vidmem::kAlive || win->comm != &c)
      throw ApiError{ncclInvalidArgument, "win was not returned by ncclCommWindowRegister on this comm "
                                          "(or was deregistered already)"};
    if (const RealNccl* real = forwarded(c)) {
      if (real->commWindowDeregister == nullptr)
        throw ApiError{ncclInvalidUsage, "the real NCCL (" + real->path + ") has no ncclCommWindowDeregister"};
      realResult(c, real->commWindowDeregister(c.real, win->real));
    } else {
      c.comm->deregisterBuffer(win->registration);  // waits for the comm's queued work first
    }
    win->magic = 0;
    delete win;
    return ncclSuccess;
  });
}

// NCCL 2.29: the buffer a window was registered with.
NCCL_API ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  return guarded("ncclWinGetUserPtr", [&] {
    ncclComm& c = usable(comm);
    checkNotNull(win, "win");
    checkNotNull(outUserPtr, "outUserPtr");
    if (win->magic != ncclWindow_vidmem::kAlive || win->comm != &c)
      throw ApiError{ncclInvalidArgument, "win was not returned by ncclCommWindowRegister on this comm"};
    *outUserPtr = win->userPtr;
    return ncclSuccess;
  });
}

// nccl_device.h (NCCL 2.28+): device pointers into windows, for NCCL's device API, which ferry does
// not offer (ncclDevCommCreate is refused); a multicast pointer never (docs/architecture.md rule 1).
NCCL_API ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t win, size_t /*offset*/, int /*peer*/, void** outPtr) {
  return guarded("ncclGetPeerDevicePointer", [&]() -> ncclResult_t {
    checkNotNull(win, "window");
    checkNotNull(outPtr, "outPtr");
    throw ApiError{ncclInvalidUsage, "ferry does not offer NCCL's device API (nccl_device.h): no peer device "
                                     "pointers of windows; ferry's own device API is its channels"};
  });
}

NCCL_API ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t win, size_t /*offset*/, void** outPtr) {
  return guarded("ncclGetLsaMultimemDevicePointer", [&]() -> ncclResult_t {
    checkNotNull(win, "window");
    checkNotNull(outPtr, "outPtr");
    throw ApiError{ncclInvalidUsage, "ferry makes no NVLink multicast objects: no multimem pointers"};
  });
}
