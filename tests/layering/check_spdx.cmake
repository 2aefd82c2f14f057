# SPDX-License-Identifier: Apache-2.0
# Every source file of the project carries an SPDX license line in its first two lines (after a shebang).
# Run as: cmake -DROOT=<source dir> -P check_spdx.cmake
set(missing "")
file(GLOB_RECURSE files RELATIVE ${ROOT}
  ${ROOT}/include/*.hpp ${ROOT}/include/*.h ${ROOT}/kernels/*.cpp ${ROOT}/kernels/*.hpp ${ROOT}/kernels/*.cu
  ${ROOT}/kernels/*.cuh ${ROOT}/kernels/*.inc ${ROOT}/tests/*.cpp ${ROOT}/tests/*.hpp ${ROOT}/tests/*.cmake
  ${ROOT}/tests/*.py ${ROOT}/bench/*.cpp ${ROOT}/bench/*.hpp ${ROOT}/tools/*.cpp ${ROOT}/tools/*.hpp
  ${ROOT}/examples/*.cpp ${ROOT}/examples/*.hpp ${ROOT}/testing/*.hpp)
# Not recursive: GLOB_RECURSE would also find the CMakeLists.txt of build trees inside the source tree.
file(GLOB lists RELATIVE ${ROOT}
  ${ROOT}/CMakeLists.txt ${ROOT}/cmake/* ${ROOT}/kernels/CMakeLists.txt ${ROOT}/tests/CMakeLists.txt
  ${ROOT}/bench/CMakeLists.txt ${ROOT}/tools/CMakeLists.txt ${ROOT}/examples/CMakeLists.txt
  ${ROOT}/tests/package/*/CMakeLists.txt)
list(APPEND files ${lists})
foreach(f IN LISTS files)
  if(f MATCHES "/data/")
    continue()
  endif()
  file(STRINGS ${ROOT}/${f} head LIMIT_COUNT 2)
  if(NOT head MATCHES "SPDX-License-Identifier: Apache-2.0")
    list(APPEND missing ${f})
  endif()
endforeach()
list(LENGTH files n)
if(missing)
  list(JOIN missing "\n  " text)
  message(FATAL_ERROR "files without an SPDX-License-Identifier line:\n  ${text}")
endif()
message(STATUS "${n} files carry an SPDX line")
