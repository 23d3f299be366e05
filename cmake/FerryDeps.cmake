# Where the build's third-party code comes from: GoogleTest (tests), CLI11 and nlohmann-json
# (tools; header-only), OpenSSL's libcrypto (the bootstrap's HMAC). Normally from Debian packages through find_package. Where there is no
# package manager (the lent GPU machine), from a folder laid out by scripts/prepare-device-deps.sh
# and carried there:
#   FERRY_THIRD_PARTY_DIR/googletest/             GoogleTest sources, built with the tests
#   FERRY_THIRD_PARTY_DIR/include/{CLI,nlohmann,openssl}/ headers (libcrypto itself: the machine's
#                                                  libcrypto.so.3, which every Linux has)
#   FERRY_THIRD_PARTY_DIR/share/cmake/...         their CMake package files, when the packages had any
#
#   include(${PROJECT_SOURCE_DIR}/cmake/FerryDeps.cmake)
#   ferry_find_gtest()      # GTest::gtest, GTest::gtest_main
#   ferry_find_cli11()      # CLI11::CLI11
#   ferry_find_json()       # nlohmann_json::nlohmann_json
#   ferry_find_crypto()     # OpenSSL::Crypto
include_guard(GLOBAL)

set(FERRY_THIRD_PARTY_DIR "${PROJECT_SOURCE_DIR}/.deps" CACHE PATH
  "Fallback for dependencies find_package does not find (see scripts/prepare-device-deps.sh)")
if(IS_DIRECTORY "${FERRY_THIRD_PARTY_DIR}")
  # After the system locations, so an installed package wins over the carried copy.
  list(APPEND CMAKE_PREFIX_PATH "${FERRY_THIRD_PARTY_DIR}")
endif()

function(ferry_find_gtest)
  if(TARGET GTest::gtest_main)
    return()
  endif()
  find_package(GTest QUIET)
  if(GTest_FOUND)
    return()
  endif()
  set(source "${FERRY_THIRD_PARTY_DIR}/googletest")
  if(NOT EXISTS "${source}/CMakeLists.txt")
    message(FATAL_ERROR "GoogleTest not found. Install it (apt-get install googletest libgtest-dev), "
      "or put its sources in ${source} (scripts/prepare-device-deps.sh), or configure with "
      "-DFERRY_BUILD_TESTS=OFF.")
  endif()
  message(STATUS "GoogleTest: building from ${source}")
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK ON CACHE BOOL "" FORCE)
  # EXCLUDE_FROM_ALL: only what tests link gets built. googletest makes GTest::gtest* aliases itself.
  add_subdirectory("${source}" "${PROJECT_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL)
endfunction()

# ferry_find_header_only(PACKAGE TARGET HEADER): the package's config if it has one, else an
# interface target on the carried headers.
function(ferry_find_header_only package target header)
  if(TARGET ${target})
    return()
  endif()
  find_package(${package} CONFIG QUIET)
  if(TARGET ${target})
    return()
  endif()
  find_path(dir ${header} PATHS "${FERRY_THIRD_PARTY_DIR}/include" NO_CACHE)
  if(NOT dir)
    message(FATAL_ERROR "${package} not found (need ${header}). Install it (apt-get install "
      "libcli11-dev nlohmann-json3-dev), or run scripts/prepare-device-deps.sh and carry "
      "${FERRY_THIRD_PARTY_DIR}, or configure with -DFERRY_BUILD_TOOLS=OFF.")
  endif()
  add_library(${target} INTERFACE IMPORTED GLOBAL)
  target_include_directories(${target} INTERFACE "${dir}")
endfunction()

function(ferry_find_cli11)
  ferry_find_header_only(CLI11 CLI11::CLI11 CLI/CLI.hpp)
endfunction()

function(ferry_find_json)
  ferry_find_header_only(nlohmann_json nlohmann_json::nlohmann_json nlohmann/json.hpp)
endfunction()

function(ferry_find_crypto)
  if(TARGET OpenSSL::Crypto)
    return()
  endif()
  find_package(OpenSSL 3.0 QUIET COMPONENTS Crypto)
  if(TARGET OpenSSL::Crypto)
    return()
  endif()
  # No development package: the carried headers and the runtime library (no libcrypto.so link).
  find_path(dir openssl/evp.h PATHS "${FERRY_THIRD_PARTY_DIR}/include" NO_DEFAULT_PATH NO_CACHE)
  find_library(FERRY_LIBCRYPTO NAMES crypto libcrypto.so.3)
  if(NOT dir OR NOT FERRY_LIBCRYPTO)
    message(FATAL_ERROR "OpenSSL's libcrypto (3.x) not found: install it (apt-get install libssl-dev), "
      "or run scripts/prepare-device-deps.sh and carry ${FERRY_THIRD_PARTY_DIR} to a machine that has "
      "libcrypto.so.3")
  endif()
  message(STATUS "libcrypto: ${FERRY_LIBCRYPTO} with the headers in ${dir}")
  add_library(OpenSSL::Crypto UNKNOWN IMPORTED GLOBAL)
  set_target_properties(OpenSSL::Crypto PROPERTIES IMPORTED_LOCATION "${FERRY_LIBCRYPTO}"
    INTERFACE_INCLUDE_DIRECTORIES "${dir}")
endfunction()
