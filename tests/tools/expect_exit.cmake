# SPDX-License-Identifier: Apache-2.0
# Runs a command and checks its exit status and that its stderr matches a regex, so a crash or an abort (which
# ctest's WILL_FAIL would also count as "failed as expected") fails the test. EXIT is a status or a regex of
# statuses ("0|1"); a signal is never a number.
#   cmake -DCMD=<program> -DARG=<argument> -DEXIT=<status> -DMATCH=<regex> -P expect_exit.cmake
execute_process(COMMAND "${CMD}" "${ARG}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc MATCHES "^(${EXIT})$")
  message(FATAL_ERROR "${CMD} ${ARG}: exit status '${rc}', expected ${EXIT}\nstderr: ${err}")
endif()
if(NOT err MATCHES "${MATCH}")
  message(FATAL_ERROR "${CMD} ${ARG}: stderr does not match '${MATCH}'\nstderr: ${err}")
endif()
message(STATUS "exit ${rc}: ${err}")
