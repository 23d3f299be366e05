# cmake -P script behind the package_find_ferry test; see CMakeLists.txt for the variables it takes.
foreach(var FERRY_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_package.cmake: ${var} is not set")
  endif()
endforeach()

function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package_find_ferry: ${step} failed (${rc}):\n${out}")
  endif()
  message(STATUS "package_find_ferry: ${step}: ok")
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${WORK_DIR})

run("install" ${CMAKE_COMMAND} --install ${FERRY_BINARY_DIR} --prefix ${prefix})

# A sanitized libferry.so needs the sanitizer runtime in whatever links it.
set(flags "")
if(SANITIZE)
  set(flags "-fsanitize=${SANITIZE}")
endif()
run("configure consumer" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build} -G ${GENERATOR}
  -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release
  "-DCMAKE_CXX_FLAGS=${flags}" "-DCMAKE_EXE_LINKER_FLAGS=${flags}")
run("build consumer" ${CMAKE_COMMAND} --build ${consumer_build})

# The consumer must have found the installed package, not the build tree.
file(STRINGS ${consumer_build}/CMakeCache.txt ferry_dir REGEX "^ferry_DIR:")
if(NOT ferry_dir MATCHES "${prefix}/")
  message(FATAL_ERROR "package_find_ferry: consumer used ${ferry_dir}, not the install in ${prefix}")
endif()

run("run consumer" ${CMAKE_COMMAND} -E env FERRY_BOOTSTRAP_TIMEOUT=7 ${consumer_build}/ferry_consumer 7)
message(STATUS "${run_output}")
