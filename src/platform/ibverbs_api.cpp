#include "platform/ibverbs_api.hpp"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "core/dynamic_library.hpp"

namespace ferry::ibverbs {
namespace {

// From <infiniband/verbs.h>: the device list is a null-terminated array of opaque pointers.
struct Device;
using GetDeviceListFn = Device** (*)(int* numDevices);
using GetDeviceNameFn = const char* (*)(Device* device);
using FreeDeviceListFn = void (*)(Device** list);

// Names from libibverbs; an empty list with `why` set when it is missing or lists nothing.
std::vector<std::string> fromVerbs(std::string& why) {
  DynamicLibrary lib = DynamicLibrary::open({"libibverbs.so.1", "libibverbs.so"});
  if (!lib) {
    why = "libibverbs not found (" + lib.error() + ")";
    return {};
  }
  auto getList = lib.symbol<GetDeviceListFn>("ibv_get_device_list");
  auto getName = lib.symbol<GetDeviceNameFn>("ibv_get_device_name");
  auto freeList = lib.symbol<FreeDeviceListFn>("ibv_free_device_list");
  if (!getList || !getName || !freeList) {
    why = lib.name() + " lacks ibv_get_device_list/ibv_get_device_name/ibv_free_device_list";
    return {};
  }
  int count = 0;
  Device** list = getList(&count);
  if (!list) {
    why = "ibv_get_device_list failed (no RDMA support in the kernel?)";
    return {};
  }
  std::vector<std::string> names;
  for (int i = 0; i < count && list[i]; ++i)
    if (const char* name = getName(list[i])) names.emplace_back(name);
  freeList(list);
  if (names.empty()) why = "libibverbs lists no device";
  return names;
}

std::vector<std::string> fromSysfs(const std::string& dir, std::string& why) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  if (ec)
    why = dir + ": " + ec.message();
  else if (names.empty())
    why = dir + " is empty";
  return names;
}

}  // namespace

DeviceList listDevices(const std::string& sysfsDir) {
  DeviceList out;
  std::string verbsWhy, sysfsWhy;
  out.names = fromVerbs(verbsWhy);
  if (!out.names.empty()) {
    out.source = "libibverbs";
  } else if (out.names = fromSysfs(sysfsDir, sysfsWhy); !out.names.empty()) {
    out.source = sysfsDir;
  } else {
    out.reason = verbsWhy + "; " + sysfsWhy;
  }
  std::ranges::sort(out.names);
  return out;
}

}  // namespace ferry::ibverbs
