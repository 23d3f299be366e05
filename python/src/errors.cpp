// ferry.Error and its subclasses. A C++ ferry::Error reaches Python as the subclass of its
// ErrorCode, with the whole message (rank, peer, operation, what to do) and `.code` set; the
// subclasses that have a built-in Python meaning also derive from it (InvalidUsage is a
// ValueError, Timeout a TimeoutError, SysError an OSError, NotSupported a NotImplementedError), so
// generic handlers keep working.
#include <array>
#include <exception>
#include <string>

#include "bindings.hpp"
#include "ferry/errors.hpp"

namespace nb = nanobind;

namespace ferry::python {
namespace {

struct Kind {
  ErrorCode code;
  const char* name;
  PyObject* builtin;  // a second base, or nullptr
  const char* doc;
};

// Indexed by ErrorCode - 1; filled in bindErrors.
std::array<PyObject*, 8> types{};
PyObject* baseType = nullptr;

PyObject* typeOf(ErrorCode code) {
  const int i = static_cast<int>(code) - 1;
  return i >= 0 && i < static_cast<int>(types.size()) && types[static_cast<std::size_t>(i)] != nullptr
             ? types[static_cast<std::size_t>(i)]
             : baseType;
}

// Raises `type(message)` with .code set.
void raise(PyObject* type, const char* message, int code) {
  PyObject* text = PyUnicode_DecodeUTF8(message, static_cast<Py_ssize_t>(std::char_traits<char>::length(message)),
                                        "replace");
  PyObject* error = text ? PyObject_CallOneArg(type, text) : nullptr;
  Py_XDECREF(text);
  if (error == nullptr) return;  // the failure to build it is the error now
  PyObject* value = PyLong_FromLong(code);
  if (value != nullptr) PyObject_SetAttrString(error, "code", value);
  Py_XDECREF(value);
  PyErr_SetObject(type, error);
  Py_DECREF(error);
}

}  // namespace

void bindErrors(nb::module_& m) {
  baseType = PyErr_NewExceptionWithDoc(
      "ferry._ferry.Error",
      "Any error ferry reports. The message names the rank, the peer and the operation; `.code` is "
      "the ErrorCode's number.",
      PyExc_RuntimeError, nullptr);
  m.attr("Error") = nb::handle(baseType);
  const Kind kinds[] = {
      {ErrorCode::InternalError, "InternalError", nullptr, "A bug in ferry."},
      {ErrorCode::InvalidUsage, "InvalidUsage", PyExc_ValueError,
       "A bad argument or a call in the wrong state: the caller must change something."},
      {ErrorCode::SystemError, "SysError", PyExc_OSError, "An operating-system call failed."},
      {ErrorCode::CudaError, "CudaError", nullptr, "A CUDA call failed."},
      {ErrorCode::Timeout, "Timeout", PyExc_TimeoutError,
       "A bounded wait expired: a peer never arrived, a signal never came."},
      {ErrorCode::RemoteError, "RemoteError", nullptr, "A peer failed, closed its connection or aborted."},
      {ErrorCode::ProtocolError, "ProtocolError", nullptr, "A malformed or unauthenticated message."},
      {ErrorCode::NotSupported, "NotSupported", PyExc_NotImplementedError,
       "Valid, but not available on this machine or in this build."},
  };
  for (const Kind& k : kinds) {
    const std::string qualified = std::string("ferry._ferry.") + k.name;
    PyObject* bases = k.builtin ? PyTuple_Pack(2, baseType, k.builtin) : PyTuple_Pack(1, baseType);
    PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), k.doc, bases, nullptr);
    Py_XDECREF(bases);
    if (type == nullptr) throw nb::python_error();
    types[static_cast<std::size_t>(static_cast<int>(k.code) - 1)] = type;
    m.attr(k.name) = nb::handle(type);
  }
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      raise(typeOf(e.code()), e.what(), static_cast<int>(e.code()));
    }
  });
}

}  // namespace ferry::python
