# SPDX-License-Identifier: Apache-2.0
# Builds tests/package/consumer against kvpager three ways. Run by ctest (test package.consumers) as
#   cmake -DKVPAGER_SOURCE_DIR=... -DKVPAGER_BUILD_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX_COMPILER=...
#         -P run_package_test.cmake
# KVPAGER_BUILD_DIR: the build tree under test, installed as it is (what a user does after building: cmake --install).
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK_DIR})
set(consumer ${CMAKE_CURRENT_LIST_DIR}/consumer)
# The consumers' own builds of kvpager (add_subdirectory, FetchContent) are CPU-only and unoptimized: this test is
# about packaging, not nvcc or speed. Build type None adds no flags (-O0): optimized, the two builds of the kernels and
# kvpager::compositions were most of this test's 6-8 minutes. What it installs is the build under test, as it was
# built.
set(common -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=None -DKVPAGER_ENABLE_CUDA=OFF)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

# 1. Install the build under test into a prefix, then find_package it. (It once configured and built a Release tree
# of its own first: the library and every tool compiled a second time, most of this test's 8 minutes.)
run(${CMAKE_COMMAND} --install ${KVPAGER_BUILD_DIR} --prefix ${WORK_DIR}/prefix)
# The installed replayer runs.
execute_process(COMMAND ${WORK_DIR}/prefix/bin/kvpager-replay ${KVPAGER_SOURCE_DIR}/tests/data/traces/C_decode_growth.kvtrace
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\"steps\": 1920")
  message(FATAL_ERROR "installed kvpager-replay failed (${rc}): ${err}")
endif()
# The installed planner runs.
execute_process(COMMAND ${WORK_DIR}/prefix/bin/kvpager-plan --model=llama-2-7b --json
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\"kv_bytes_per_token\": 524288")
  message(FATAL_ERROR "installed kvpager-plan failed (${rc}): ${err}")
endif()
foreach(f include/kvpager/kvpager.hpp include/kvpager/c/kernels.h include/kvpager/sizing/kv_sizing.hpp
          lib/cmake/kvpager/kvpagerConfig.cmake lib/cmake/kvpager/kvpagerConfigVersion.cmake bin/kvpager-replay
          bin/kvpager-plan)
  if(NOT EXISTS ${WORK_DIR}/prefix/${f})
    message(FATAL_ERROR "install is missing ${f}")
  endif()
endforeach()
run(${CMAKE_COMMAND} ${common} -S ${consumer} -B ${WORK_DIR}/find_package -DKVPAGER_CONSUME=find_package
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/find_package)

# The examples are a project of their own too: built and run in a binary directory of their own against the
# installed package (what `cmake -S examples -B <dir> -DCMAKE_PREFIX_PATH=<prefix>` does for a user).
run(${CMAKE_COMMAND} ${common} -S ${KVPAGER_SOURCE_DIR}/examples -B ${WORK_DIR}/examples
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/examples --target run_examples)

# 2. add_subdirectory and 3. FetchContent from the source tree.
foreach(mode subdirectory fetchcontent)
  run(${CMAKE_COMMAND} ${common} -S ${consumer} -B ${WORK_DIR}/${mode} -DKVPAGER_CONSUME=${mode}
      -DKVPAGER_SOURCE_DIR=${KVPAGER_SOURCE_DIR})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/${mode})
endforeach()

# A version the package does not satisfy must be refused.
execute_process(COMMAND ${CMAKE_COMMAND} ${common} -S ${consumer} -B ${WORK_DIR}/badversion
  -DKVPAGER_CONSUME=find_package -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DKVPAGER_REQUIRED_VERSION=9.0
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "version")
  message(FATAL_ERROR "find_package(kvpager 9.0) against 0.3 did not fail on the version:\n${err}")
endif()
message(STATUS "package test: find_package, add_subdirectory and FetchContent consumers and the standalone examples built and ran")
