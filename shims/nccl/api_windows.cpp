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
