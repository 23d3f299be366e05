/* A plain C program that sees only nccl.h: it must compile as C, link against libferry_nccl, and
 * get NCCL's answers for the calls that need no GPU: the version, error strings, and clear errors
 * (with a message from ncclGetLastError) for bad arguments. Exit status 0 when all hold. */
#include <nccl.h>
#include <stdio.h>
#include <string.h>

/* NCCL 2.29/2.30 functions the library exports beyond its 2.28 header (shims/nccl/api_newer.cpp). */
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank, ncclComm_t* newcomm,
                          ncclConfig_t* config);
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr);

static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s (last error: %s)\n", what, ncclGetLastError(NULL));
    ++failures;
  }
}

static void expectError(ncclResult_t got, ncclResult_t want, const char* phrase, const char* what) {
  expect(got == want, what);
  expect(strstr(ncclGetLastError(NULL), phrase) != NULL, phrase);
}

int main(void) {
  int version = 0;
  expect(ncclGetVersion(&version) == ncclSuccess, "ncclGetVersion succeeds");
  expect(version == NCCL_VERSION_CODE, "ncclGetVersion reports NCCL_VERSION_CODE");
  expect(version >= NCCL_VERSION(2, 19, 0), "the API version is 2.19 or later (ncclCommRegister exists)");
  expectError(ncclGetVersion(NULL), ncclInvalidArgument, "version is NULL", "ncclGetVersion(NULL)");

  for (int r = 0; r <= ncclNumResults; ++r) expect(ncclGetErrorString((ncclResult_t)r) != NULL, "error strings");
  expect(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "ncclSuccess reads 'no error'");

  int count = 0;
  expectError(ncclCommCount(NULL, &count), ncclInvalidArgument, "comm is NULL", "ncclCommCount(NULL)");
  expectError(ncclAllReduce(NULL, NULL, 1, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument, "ncclAllReduce: comm is NULL",
              "ncclAllReduce on a NULL comm");
  expectError(ncclGroupEnd(), ncclInvalidUsage, "without a matching ncclGroupStart", "unmatched ncclGroupEnd");
  expect(ncclGroupStart() == ncclSuccess && ncclGroupEnd() == ncclSuccess, "an empty group");
  expect(ncclCommDestroy(NULL) == ncclSuccess, "ncclCommDestroy(NULL) is a no-op");
  expectError(ncclGetUniqueId(NULL), ncclInvalidArgument, "uniqueId is NULL", "ncclGetUniqueId(NULL)");

  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  ncclComm_t comm = NULL;
  expectError(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument, "nranks 0 must be at least 1", "nranks 0");
  expectError(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument, "rank 2 is out of range [0, 2)", "rank 2 of 2");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 7;
  expectError(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclInvalidArgument, "config->blocking 7",
              "blocking 7");
  expectError(ncclMemFree((void*)&id), ncclInvalidArgument, "not returned by ncclMemAlloc", "ncclMemFree of a stack address");

  /* NCCL 2.27/2.28 calls: arguments are checked the same way. */
  expect(version == NCCL_VERSION(2, 28, 9), "the API version is 2.28.9");
  expectError(ncclGather(NULL, NULL, 1, ncclFloat, 0, NULL, NULL), ncclInvalidArgument, "ncclGather: comm is NULL",
              "ncclGather on a NULL comm");
  expectError(ncclScatter(NULL, NULL, 1, ncclFloat, 0, NULL, NULL), ncclInvalidArgument, "ncclScatter: comm is NULL",
              "ncclScatter on a NULL comm");
  ncclWindow_t win = NULL;
  expectError(ncclCommWindowRegister(NULL, &id, 4096, &win, NCCL_WIN_DEFAULT), ncclInvalidArgument,
              "ncclCommWindowRegister: comm is NULL", "ncclCommWindowRegister on a NULL comm");
  expectError(ncclCommWindowDeregister(NULL, win), ncclInvalidArgument, "ncclCommWindowDeregister: comm is NULL",
              "ncclCommWindowDeregister on a NULL comm");
  ncclComm_t shrunk = NULL;
  int excluded[1] = {1};
  expectError(ncclCommShrink(NULL, excluded, 1, &shrunk, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
              "ncclCommShrink: comm is NULL", "ncclCommShrink on a NULL comm");
  expectError(ncclCommRevoke(NULL, NCCL_REVOKE_DEFAULT), ncclInvalidArgument, "ncclCommRevoke: comm is NULL",
              "ncclCommRevoke on a NULL comm");
  expectError(ncclCommInitRankScalable(&comm, 2, 0, 0, &id, NULL), ncclInvalidArgument, "nId 0 must be >= 1",
              "ncclCommInitRankScalable with no ids");
  expectError(ncclCommInitRankScalable(&comm, 2, 0, 1, NULL, NULL), ncclInvalidArgument, "commIds is NULL",
              "ncclCommInitRankScalable with NULL ids");
  expectError(ncclCommInitRankScalable(&comm, 2, 5, 1, &id, NULL), ncclInvalidArgument, "rank 5 is out of range",
              "ncclCommInitRankScalable rank 5 of 2");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  expectError(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "without a matching ncclGroupStart",
              "unmatched ncclGroupSimulateEnd");
  expect(ncclGroupStart() == ncclSuccess && ncclGroupSimulateEnd(&sim) == ncclSuccess && sim.estimatedTime == 0.0f,
         "an empty group simulates to 0 us");
  expectError(ncclGroupEnd(), ncclInvalidUsage, "without a matching ncclGroupStart",
              "ncclGroupSimulateEnd closed the group");
  ncclSimInfo_t unset;
  memset(&unset, 0, sizeof(unset));
  expect(ncclGroupStart() == ncclSuccess, "ncclGroupStart");
  expectError(ncclGroupSimulateEnd(&unset), ncclInvalidArgument, "NCCL_SIM_INFO_INITIALIZER",
              "ncclGroupSimulateEnd with an unset simInfo");
  expect(ncclGroupStart() == ncclSuccess, "a nested ncclGroupStart");
  expectError(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "must end the outermost group",
              "ncclGroupSimulateEnd of an inner group");
  expect(ncclGroupEnd() == ncclSuccess && ncclGroupEnd() == ncclSuccess, "both groups end");
  ncclResetDebugInit();
  expectError(ncclCommGrow(NULL, 4, &id, 3, &comm, NULL), ncclInvalidUsage, "ferry does not offer growing",
              "ncclCommGrow is refused, saying what is not offered");
  expectError(ncclCommSuspend(NULL, 1), ncclInvalidArgument, "ncclCommSuspend: comm is NULL",
              "ncclCommSuspend on a NULL comm");
  void* user = NULL;
  expectError(ncclWinGetUserPtr(NULL, win, &user), ncclInvalidArgument, "ncclWinGetUserPtr: comm is NULL",
              "ncclWinGetUserPtr on a NULL comm");
  /* A config of a later NCCL (2.29 appends two ints): read up to what this header knows. */
  struct {
    ncclConfig_t base;
    int graphUsageMode, numRmaCtx;
  } later = {NCCL_CONFIG_INITIALIZER, 0, 0};
  later.base.size = sizeof(later);
  later.base.blocking = 7;
  expectError(ncclCommInitRankConfig(&comm, 2, id, 0, &later.base), ncclInvalidArgument, "config->blocking 7",
              "a 2.29-sized config is read (blocking 7 refused)");

  if (failures == 0) printf("nccl.h C API check: all passed (API version %d)\n", version);
  return failures == 0 ? 0 : 1;
}
