# SPDX-License-Identifier: Apache-2.0
# xxHash is an explicit build feature (KVPAGER_HAS_XXHASH): with it off the umbrella headers compile without prefix
# caching, a composition over it is not declared, and its hasher is a clear #error.
#   cmake -DCXX=<compiler> -DINCLUDE_DIR=<repo>/include -DSRC=<xxhash_off.cpp> -P xxhash_feature.cmake
function(compile out_rc out_err)
  execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -DKVPAGER_HAS_XXHASH=0 ${ARGN} -I${INCLUDE_DIR} ${SRC}
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  set(${out_rc} ${rc} PARENT_SCOPE)
  set(${out_err} "${err}" PARENT_SCOPE)
endfunction()
compile(rc err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "KVPAGER_HAS_XXHASH=0: the umbrella headers do not compile:\n${err}")
endif()
compile(rc err -DKVPAGER_PROBE_COMPOSITION)
if(rc EQUAL 0 OR NOT err MATCHES "vllm_v1_cache")
  message(FATAL_ERROR "KVPAGER_HAS_XXHASH=0: vllm_v1_cache is still declared (or another error):\n${err}")
endif()
compile(rc err -DKVPAGER_PROBE_HASHER)
if(rc EQUAL 0 OR NOT err MATCHES "needs xxHash")
  message(FATAL_ERROR "KVPAGER_HAS_XXHASH=0: the hasher's #error is missing:\n${err}")
endif()
message(STATUS "xxHash feature off: umbrellas compile, prefix caching absent, hasher refused with its message")
