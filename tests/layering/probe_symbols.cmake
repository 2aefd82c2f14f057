# SPDX-License-Identifier: Apache-2.0
# probe_symbols(<src> <obj> <out> [flags...]): compiles <src> to <obj> with ${CXX} (-std=c++20, -I${INCLUDE_DIR},
# and the flags) and sets <out> to the symbols the object defines (${NM} -C --defined-only). A compile or nm failure
# is a test failure naming the file. Included by the layering scripts that read what a probe unit instantiates.
function(probe_symbols src obj out)
  execute_process(COMMAND ${CXX} -std=c++20 ${ARGN} -I${INCLUDE_DIR} -c ${src} -o ${obj}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${src}: the probe does not compile:\n${err}")
  endif()
  execute_process(COMMAND ${NM} -C --defined-only ${obj} RESULT_VARIABLE rc OUTPUT_VARIABLE syms ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} ${obj}: ${err}")
  endif()
  set(${out} "${syms}" PARENT_SCOPE)
endfunction()
