#include "executor/device_plans.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "platform/cuda_check.hpp"
#include "executor/plan_algorithm.hpp"
#include "platform/device_upload.hpp"

namespace ferry::executor {
namespace {

std::size_t alignUp(std::size_t n) { return (n + 15) / 16 * 16; }

template <class T>
std::size_t bytesOf(const std::vector<T>& v) {
  return alignUp(v.size() * sizeof(T));
}

}  // namespace

DevicePlans::DevicePlans(int rank, int worldSize) {
  std::vector<const RankProgram*> mine;
  for (const Algorithm* a : planAlgorithms()) {
    const auto* e = static_cast<const PlanAlgorithm*>(a)->forWorldSize(worldSize);
    if (e != nullptr) mine.push_back(&e->programs[static_cast<std::size_t>(rank)]);
  }
  upload(mine);
}

void DevicePlans::add(const RankProgram* program) {
  if (find(program) == nullptr) upload({program});
}

void DevicePlans::upload(const std::vector<const RankProgram*>& mine) {
  if (mine.empty()) return;
  std::size_t total = 0;
  for (const RankProgram* p : mine) total += bytesOf(p->ops) + bytesOf(p->refs) + bytesOf(p->tbFirst);
  std::vector<char> host(total, 0);
  void* memory = nullptr;
  FERRY_CUDA_CHECK(cudaMalloc(&memory, total));
  memory_.push_back(memory);
  auto* base = static_cast<char*>(memory);
  std::size_t at = 0;
  auto place = [&](const auto& v) {
    if (!v.empty()) std::memcpy(host.data() + at, v.data(), v.size() * sizeof(v[0]));
    const char* where = base + at;
    at += bytesOf(v);
    return where;
  };
  for (const RankProgram* p : mine) {
    DeviceProgram d;
    d.ops = reinterpret_cast<const ExecOp*>(place(p->ops));
    d.refs = reinterpret_cast<const ExecRef*>(place(p->refs));
    d.tbFirst = reinterpret_cast<const std::uint32_t*>(place(p->tbFirst));
    programs_.emplace_back(p, d);
  }
  uploadNow(memory, host.data(), total);  // (a kernel on any stream reads them)
}

DevicePlans::~DevicePlans() {
  for (void* m : memory_) (void)cudaFree(m);
}

const DeviceProgram* DevicePlans::find(const RankProgram* program) const {
  for (const auto& [p, d] : programs_)
    if (p == program) return &d;
  return nullptr;
}

}  // namespace ferry::executor
