# SPDX-License-Identifier: Apache-2.0
# Checks that kvpager's layers run one way: every header under include/kvpager/<folder>/ may include kvpager headers
# only from the folders its layer may use, and the lowest layers only the C++ standard library.
#
#   cmake -DINCLUDE_DIR=<repo>/include -P check_layers.cmake
#
# Layers, lowest first: core < concepts < policies (allocator, eviction, sharing, swap, groups: KV cache group kinds,
# tier: the host tier of the prefix cache and its policies)
# < cache < sched < monitor. The tuning policies (tuning/) speak only core and are used by sched. The kernel API (kernels/) and the C ABI (c/) sit
# beside them and speak only core; sizing/ (model sizing, tensor-parallel layout and executors, block size advice)
# sits above the kernel API and below nothing else; transfer/ (KV transfer between caches) sits above sizing. The rules are the tables below; a folder missing from them is an
# error, so a new folder is placed in a layer on purpose. Prints every violation, then fails.

cmake_minimum_required(VERSION 3.25)

if(NOT INCLUDE_DIR)
  message(FATAL_ERROR "check_layers.cmake: pass -DINCLUDE_DIR=<path to include/>")
endif()

set(policy_folders allocator eviction sharing swap groups tier)

# <folder>: the kvpager folders its headers may include (its own folder is always allowed).
set(allowed_core "")
set(allowed_concepts core)
foreach(p IN LISTS policy_folders)
  # Policies may build on each other's headers (e.g. a swap policy over an allocator), never on cache or sched.
  set(allowed_${p} core concepts ${policy_folders})
endforeach()
set(allowed_cache core concepts ${policy_folders})
# Tuning policies (dynamic batch size, priority aging, swap-or-recompute cost model) take plain signals and return
# decisions: they speak only core; the scheduler takes them through its config.
set(allowed_tuning core)
set(allowed_sched core concepts ${policy_folders} cache tuning)
# monitor/: metrics, health and exposition over a cache and its scheduler (the serving layer's operator view).
set(allowed_monitor core concepts ${policy_folders} cache tuning sched)
set(allowed_kernels core c)
set(allowed_c "")
set(allowed_sizing core kernels c)
# transfer/: KV transfer between caches (the runs a transfer moves, the transport concept, its in-process and UCX
# models): beside the kernel API, it speaks core, the kernel API's layouts and sizing's tensor-parallel layout.
set(allowed_transfer core kernels c sizing)

# Folders whose headers may include only the C++ standard library besides kvpager (no third-party headers).
set(std_only_folders core concepts tuning)

# Known exceptions, "<header relative to include/kvpager>=><included header>". Each is a layering debt: delete the
# entry when the include is gone (the check fails on an exception that no longer occurs, so the table stays true).
set(exceptions "")

get_filename_component(INCLUDE_DIR "${INCLUDE_DIR}" ABSOLUTE)
set(root ${INCLUDE_DIR}/kvpager)
file(GLOB_RECURSE headers RELATIVE ${root} ${root}/*.hpp ${root}/*.h)
list(SORT headers)
set(violations "")
set(used_exceptions "")
set(checked 0)
foreach(h IN LISTS headers)
  if(NOT h MATCHES "/")
    continue()  # kvpager.hpp, the umbrella header, includes every layer by design
  endif()
  string(REGEX MATCH "^[^/]+" folder "${h}")
  if(NOT DEFINED allowed_${folder})
    list(APPEND violations "${h}: folder '${folder}/' has no layer in tests/layering/check_layers.cmake")
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  file(STRINGS ${root}/${h} lines REGEX "^[ \t]*#[ \t]*include")
  foreach(line IN LISTS lines)
    if(line MATCHES "#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]")
      set(inc "${CMAKE_MATCH_1}")
    else()
      list(APPEND violations "${h}: unparsed include line '${line}'")
      continue()
    endif()
    if(inc MATCHES "^kvpager/([^/]+)/")
      set(to "${CMAKE_MATCH_1}")
      if(to STREQUAL folder OR to IN_LIST allowed_${folder})
        continue()
      endif()
      if("${h}=>${inc}" IN_LIST exceptions)
        list(APPEND used_exceptions "${h}=>${inc}")
        continue()
      endif()
      list(APPEND violations "${h}: the ${folder}/ layer may not include ${inc} (allowed: ${folder} ${allowed_${folder}})")
    elseif(inc MATCHES "^kvpager/")
      list(APPEND violations "${h}: includes the umbrella header ${inc}")
    elseif(inc MATCHES "^\\.")
      list(APPEND violations "${h}: relative include ${inc}; include kvpager headers as kvpager/<folder>/<name>")
    elseif(folder IN_LIST std_only_folders AND NOT inc MATCHES "^[a-z_0-9]+$")
      list(APPEND violations "${h}: the ${folder}/ layer may include only standard C++ headers, not <${inc}>")
    endif()
  endforeach()
endforeach()

foreach(e IN LISTS exceptions)
  if(NOT e IN_LIST used_exceptions)
    list(APPEND violations "exception '${e}' no longer occurs: delete it from the table in check_layers.cmake")
  endif()
endforeach()

if(checked EQUAL 0)
  message(FATAL_ERROR "check_layers.cmake: no headers found under ${root}")
endif()
if(violations)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "layering violations:\n  ${text}")
endif()
message(STATUS "layering: ${checked} headers include only their own or lower layers")
