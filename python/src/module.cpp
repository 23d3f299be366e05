// ferry._ferry: the C++ library as Python sees it (bindings.hpp lists the parts).
#include "bindings.hpp"

#include "ferry/version.hpp"

NB_MODULE(_ferry, m) {
  m.doc() = "ferry's C++ library: bootstrap, communicators and channels (import ferry, not this)";
  m.attr("__version__") = FERRY_VERSION_STRING;
  ferry::python::bindErrors(m);
  ferry::python::bindVocabulary(m);
  ferry::python::bindBootstrap(m);
  ferry::python::bindAlgorithms(m);
  ferry::python::bindComm(m);
  ferry::python::bindChannels(m);
  ferry::python::bindSymmetric(m);
  ferry::python::bindDlpack(m);
}
