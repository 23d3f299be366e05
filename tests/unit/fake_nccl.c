/* A stand-in for NVIDIA's NCCL holding the functions ferry opens for the network under a Comm across
 * hosts (platform/nccl_net.cpp), for tests/unit/nccl_net_test.cpp on machines without NCCL: each
 * answers success and does nothing. Built whole, and with FAKE_NCCL_PARTIAL without ncclCommAbort
 * and ncclSend (a library that lacks what ferry calls). */
#include <stddef.h>
#include <string.h>

typedef struct {
  char internal[128];
} ncclUniqueId;

__attribute__((visibility("default"))) int ncclGetVersion(int* version) {
  *version = 22809;
  return 0;
}
__attribute__((visibility("default"))) int ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 7, sizeof *id);
  return 0;
}
__attribute__((visibility("default"))) const char* ncclGetErrorString(int result) {
  return result == 0 ? "no error" : "fake error";
}
__attribute__((visibility("default"))) const char* ncclGetLastError(void* comm) {
  (void)comm;
  return "";
}
__attribute__((visibility("default"))) int ncclCommInitRank(void** comm, int n, ncclUniqueId id, int rank) {
  (void)n, (void)id, (void)rank;
  *comm = comm;
  return 0;
}
__attribute__((visibility("default"))) int ncclCommDestroy(void* comm) {
  (void)comm;
  return 0;
}
__attribute__((visibility("default"))) int ncclCommGetAsyncError(void* comm, int* error) {
  (void)comm;
  *error = 0;
  return 0;
}
__attribute__((visibility("default"))) int ncclRecv(void* buf, size_t count, int type, int peer, void* comm,
                                                    void* stream) {
  (void)buf, (void)count, (void)type, (void)peer, (void)comm, (void)stream;
  return 0;
}
__attribute__((visibility("default"))) int ncclGroupStart(void) { return 0; }
__attribute__((visibility("default"))) int ncclGroupEnd(void) { return 0; }
#ifndef FAKE_NCCL_PARTIAL
__attribute__((visibility("default"))) int ncclCommAbort(void* comm) {
  (void)comm;
  return 0;
}
__attribute__((visibility("default"))) int ncclSend(const void* buf, size_t count, int type, int peer, void* comm,
                                                    void* stream) {
  (void)buf, (void)count, (void)type, (void)peer, (void)comm, (void)stream;
  return 0;
}
#endif
