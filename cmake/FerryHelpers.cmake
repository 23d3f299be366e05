# Compile settings shared by every ferry target.
add_library(ferry_build_flags INTERFACE)
target_compile_options(ferry_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-missing-field-initializers>
  $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr>)
if(FERRY_WARNINGS_AS_ERRORS)
  target_compile_options(ferry_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX,C>:-Werror> $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
endif()
if(FERRY_SANITIZE)
  target_compile_options(ferry_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${FERRY_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(ferry_build_flags INTERFACE -fsanitize=${FERRY_SANITIZE})
endif()

# ferry_keep_runtime_private(TARGET): a shared library exports none of the static archives it
# links. Toolchains that link libstdc++ (and libgcc) statically, as the lent GPU machine's does,
# would otherwise export their copy of std::ostream, std::locale, ... from libferry.so; in a process
# that already has libstdc++.so.6 (every PyTorch program) the dynamic linker then binds some of
# those calls to one copy and some to the other, and the first formatted number crashes.
function(ferry_keep_runtime_private target)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    target_link_options(${target} PRIVATE "LINKER:--exclude-libs,ALL")
  endif()
endfunction()

# ferry_add_test(NAME SOURCES... LABELS ... [LIBS ...] [TIMEOUT s] [NO_GTEST_MAIN])
# Labels say how a test launches: unit (host only), mp (several processes on loopback),
# gpu (needs GPUs; run by scripts/gpu-check.sh), python.
function(ferry_add_test name)
  cmake_parse_arguments(T "NO_GTEST_MAIN" "TIMEOUT" "SOURCES;LABELS;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ferry_internal ferry_build_flags GTest::gtest ${T_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  if(NOT T_NO_GTEST_MAIN)
    target_link_libraries(${name} PRIVATE GTest::gtest_main)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT})
endfunction()
