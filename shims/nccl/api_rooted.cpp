// ncclGather and ncclScatter: one group of sends and receives on the comm, through this library's
// own ncclSend / ncclRecv (natively one ferry group, one kernel; on a forwarded comm the real
// NCCL's send and receive in its group). The root's own block is a send to itself in the same
// group, which both ferry and NCCL allow.
#include <cstddef>

#include "api_internal.hpp"
#include "checks.hpp"
#include "results.hpp"

#define NCCL_API extern "C" __attribute__((visibility("default")))

namespace ferry::nccl {
namespace {

// `sends` or receives one block per rank at the root, one block elsewhere; a failure names `api`.
ncclResult_t rooted(bool gather, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                    int root, ncclComm_t comm, cudaStream_t stream) {
  const char* api = gather ? "ncclGather" : "ncclScatter";
  return guarded(api, [&] {
    ncclComm& c = usable(comm);
    checkDataType(datatype);
    checkRankIn(root, c.nranks, "root");
    checkCount(count, datatype, static_cast<std::size_t>(c.nranks));
    const std::size_t block = count * elementBytes(datatype);
    auto step = [&](ncclResult_t r) {
      if (r != ncclSuccess) throw ApiError{r, lastError()};
    };
    step(ncclGroupStart());
    ncclResult_t result = ncclSuccess;
    try {
      if (gather) {
        step(ncclSend(sendbuff, count, datatype, root, comm, stream));
        if (c.rank == root)
          for (int r = 0; r < c.nranks; ++r)
            step(ncclRecv(static_cast<char*>(recvbuff) + r * block, count, datatype, r, comm, stream));
      } else {
        if (c.rank == root)
          for (int r = 0; r < c.nranks; ++r)
            step(ncclSend(static_cast<const char*>(sendbuff) + r * block, count, datatype, r, comm, stream));
        step(ncclRecv(recvbuff, count, datatype, root, comm, stream));
      }
    } catch (...) {
      (void)ncclGroupEnd();  // this call's group closes either way
      throw;
    }
    result = ncclGroupEnd();
    step(result);
    return result;
  });
}

}  // namespace
}  // namespace ferry::nccl

NCCL_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 int root, ncclComm_t comm, cudaStream_t stream) {
  return ferry::nccl::rooted(true, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

NCCL_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  int root, ncclComm_t comm, cudaStream_t stream) {
  return ferry::nccl::rooted(false, sendbuff, recvbuff, count, datatype, root, comm, stream);
}
