# SPDX-License-Identifier: Apache-2.0
# KVPAGER_EXTERN_COMPOSITIONS (core/config.hpp, the kvpager::compositions target): a translation unit that uses a
# named composition and its scheduler instantiates none of their members; without it, it instantiates them itself
# (the control, which shows that the symbols below are what such a unit would define). At -O0, where every
# instantiated inline member is emitted as a weak symbol.
#   cmake -DCXX=<compiler> -DNM=<nm> -DINCLUDE_DIR=<repo>/include -DSRC=<extern_probe.cpp> -DOUT=<dir> -P ...
set(members "paged_kv_cache<[^\n]*>::add_sequence\\(" "paged_kv_cache<[^\n]*>::append_tokens\\("
            "paged_kv_cache<[^\n]*>::create\\(" "scheduler<[^\n]*>::schedule\\(\\)" "scheduler<[^\n]*>::add_request\\("
            "scheduler<[^\n]*>::scheduler\\(" "hybrid_kv_cache<[^\n]*>::add_sequence\\("
            "hybrid_kv_cache<[^\n]*>::append_tokens\\(" "hybrid_kv_cache<[^\n]*>::create\\("
            "scheduler<kvpager::[^\n]*hybrid_kv_cache<[^\n]*>::schedule\\(\\)")
include(${CMAKE_CURRENT_LIST_DIR}/probe_symbols.cmake)
function(defined_symbols extern out)
  probe_symbols(${SRC} ${OUT}/extern_probe_${extern}.o syms -O0 -DKVPAGER_HAS_XXHASH=1
                -DKVPAGER_EXTERN_COMPOSITIONS=${extern})
  set(${out} "${syms}" PARENT_SCOPE)
endfunction()
defined_symbols(0 header_only)
defined_symbols(1 extern)
foreach(m IN LISTS members)
  if(NOT header_only MATCHES "${m}")
    message(FATAL_ERROR "header-only: the probe does not define ${m} (the control failed: the probe or the pattern)")
  endif()
  if(extern MATCHES "${m}")
    string(REGEX MATCH "[^\n]*${m}[^\n]*" line "${extern}")
    message(FATAL_ERROR "KVPAGER_EXTERN_COMPOSITIONS=1: the probe still instantiates ${line}")
  endif()
endforeach()
message(STATUS "extern compositions: none of the members is instantiated by a unit that uses them")
