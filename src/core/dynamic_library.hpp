#pragma once
// DynamicLibrary: a system library loaded at run time with dlopen and closed when the object dies.
// ferry loads optional libraries this way (NVML, libibverbs) so that libferry.so starts, with less,
// on machines where they are missing.
//
//   auto nvml = DynamicLibrary::open({"libnvidia-ml.so.1", "libnvidia-ml.so"});
//   if (!nvml) FERRY_LOG(Info, Transport) << "no NVML: " << nvml.error();
//   auto init = nvml.symbol<int (*)()>("nvmlInit_v2");  // nullptr when the library lacks it
//
// A symbol stays valid only while its DynamicLibrary lives: keep both in one object.
#include <initializer_list>
#include <string>
#include <type_traits>

namespace ferry {

class DynamicLibrary {
 public:
  // Tries each name in order (RTLD_NOW | RTLD_LOCAL); the first that loads wins. When none loads,
  // the result is invalid and error() holds dlerror()'s text for each name tried.
  static DynamicLibrary open(std::initializer_list<const char*> names);

  DynamicLibrary() = default;
  DynamicLibrary(DynamicLibrary&& other) noexcept;
  DynamicLibrary& operator=(DynamicLibrary&& other) noexcept;
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;
  ~DynamicLibrary();

  explicit operator bool() const noexcept { return handle_ != nullptr; }
  // The name that loaded; empty when invalid.
  const std::string& name() const noexcept { return name_; }
  // Why open() failed; empty when valid.
  const std::string& error() const noexcept { return error_; }

  // The address of `symbolName`, or nullptr when the library does not export it (or is invalid).
  void* rawSymbol(const char* symbolName) const noexcept;

  template <class Fn>
  Fn symbol(const char* symbolName) const noexcept {
    static_assert(std::is_pointer_v<Fn> && std::is_function_v<std::remove_pointer_t<Fn>>,
                  "symbol<Fn>: Fn must be a function pointer type");
    return reinterpret_cast<Fn>(rawSymbol(symbolName));
  }

 private:
  void* handle_ = nullptr;
  std::string name_;
  std::string error_;
};

}  // namespace ferry
