#include "core/dynamic_library.hpp"

#include <dlfcn.h>

#include <utility>

namespace ferry {

DynamicLibrary DynamicLibrary::open(std::initializer_list<const char*> names) {
  DynamicLibrary lib;
  for (const char* name : names) {
    if (void* handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
      lib.handle_ = handle;
      lib.name_ = name;
      lib.error_.clear();
      return lib;
    }
    const char* why = ::dlerror();
    if (!lib.error_.empty()) lib.error_ += "; ";
    lib.error_ += why ? why : (std::string("dlopen(") + name + ") failed");
  }
  if (lib.error_.empty()) lib.error_ = "no library name given";
  return lib;
}

DynamicLibrary::DynamicLibrary(DynamicLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      name_(std::move(other.name_)),
      error_(std::move(other.error_)) {}

DynamicLibrary& DynamicLibrary::operator=(DynamicLibrary&& other) noexcept {
  if (this != &other) {
    if (handle_) ::dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    name_ = std::move(other.name_);
    error_ = std::move(other.error_);
  }
  return *this;
}

DynamicLibrary::~DynamicLibrary() {
  if (handle_) ::dlclose(handle_);
}

void* DynamicLibrary::rawSymbol(const char* symbolName) const noexcept {
  if (!handle_ || !symbolName) return nullptr;
  return ::dlsym(handle_, symbolName);
}

}  // namespace ferry
