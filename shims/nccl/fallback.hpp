#pragma once
// The real NCCL that communicators ferry cannot run natively are forwarded to (FERRY_NCCL_FALLBACK,
// default libnccl.so.2): those whose ranks span hosts, or all of them with FERRY_NCCL_FORWARD_ALL=1. It is
// loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND), so its own calls resolve inside it, never to ferry's
// exports; a file that turns out to be ferry's shim is refused. NVLink multicast stays off in it unless ferry
// allows it (architecture.md rule 1).
#include <memory>
#include <string>

#include "nccl_table.hpp"

namespace ferry::nccl {

// The table of the real library (nccl_table.hpp).
using RealNccl = NcclTable;

// The process's real NCCL, loaded on first use; nullptr (and `why`) when there is none.
const RealNccl* realNccl(std::string& why);

}  // namespace ferry::nccl
