#pragma once
// The nanobind extension ferry._ferry: one registration function per concept, called by module.cpp.
// The Python package (python/ferry) re-exports what it defines; docs/python.md is the user's guide.
#include <nanobind/nanobind.h>

namespace ferry::python {

// ferry.Error and one subclass per ErrorCode; every ferry::Error thrown by a binding becomes one.
void bindErrors(nanobind::module_& m);
// DataType, ReduceOp, Collective.
void bindVocabulary(nanobind::module_& m);
// UniqueId and the TCP bootstrap.
void bindBootstrap(nanobind::module_& m);
// CollectiveArgs and NativeAlgorithm (subclassed in Python); before bindComm, which takes them.
void bindAlgorithms(nanobind::module_& m);
// Comm on device addresses, and AlgorithmInfo.
void bindComm(nanobind::module_& m);
// The channel layer: allocations, registered memory, connections, semaphores, channels, the proxy.
void bindChannels(nanobind::module_& m);
// Symmetric memory: its segments, the pluggable-allocator functions, SymmetricMemory (after
// bindChannels, whose Communicator it takes).
void bindSymmetric(nanobind::module_& m);
// _dlpack_info: what a __dlpack__ object describes (python/ferry/buffers.py).
void bindDlpack(nanobind::module_& m);

}  // namespace ferry::python
