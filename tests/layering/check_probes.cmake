# Builds each layering probe (tests/CMakeLists.txt) and fails unless every one fails to compile
# because the wrong-way header is not on that layer's include path. A probe that compiles means a
# layer can see a layer above it: the build no longer enforces the direction of dependencies.
#   cmake -DBUILD_DIR=... -DPROBES="core:lockstep/ops/context.hpp;..." -P check_probes.cmake
set(failures 0)
foreach(entry ${PROBES})
  string(REPLACE ":" ";" entry ${entry})
  list(GET entry 0 layer)
  list(GET entry 1 header)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target layering_probe_${layer}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(FIND "${out}" "${header}: No such file" found)
  if(rc EQUAL 0)
    message(SEND_ERROR "layer ${layer} compiled #include \"${header}\": it can see a layer above it")
    math(EXPR failures "${failures} + 1")
  elseif(found EQUAL -1)
    message(SEND_ERROR "layer ${layer}'s probe failed for another reason than the missing "
                       "${header}:\n${out}")
    math(EXPR failures "${failures} + 1")
  else()
    message(STATUS "ok: layer ${layer} cannot include ${header}")
  endif()
endforeach()
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} layering probe(s) did not fail as they must")
endif()
