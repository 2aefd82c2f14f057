# SPDX-License-Identifier: Apache-2.0
# No umbrella converts a std::vector to a std::span in code that every including unit compiles (a non-template
# function, or a call in a template that names none of its parameters): such a conversion goes through span's range
# constructor, whose constraints instantiate std::ranges' begin/end/size/data for the vector's type (about 0.2 G
# compiler instructions the first time in a unit; bench/RESULTS.md, issue 22). The headers convert through
# detail::span_of (core/span_of.hpp) there. At -O0 with -fkeep-inline-functions every instantiated inline function is
# emitted, so the object of a unit that only includes an umbrella names each such conversion's
# ranges::begin. The control (a unit that makes one such conversion) shows that the pattern finds one; a standard
# library that names it otherwise (not libstdc++) skips the test.
#   cmake -DCXX=<compiler> -DNM=<nm> -DINCLUDE_DIR=<repo>/include -DOUT=<dir> -P ...
set(pattern "ranges::__cust_access::_Begin::operator\\(\\)<std::vector<")
include(${CMAKE_CURRENT_LIST_DIR}/probe_symbols.cmake)
function(emitted name source out)
  set(src ${OUT}/span_probe_${name}.cpp)
  file(WRITE ${src} "${source}")
  probe_symbols(${src} ${OUT}/span_probe_${name}.o syms -O0 -fkeep-inline-functions -DKVPAGER_HAS_XXHASH=1)
  set(${out} "${syms}" PARENT_SCOPE)
endfunction()
set(control_source "#include <span>\n#include <vector>\n")
string(APPEND control_source "inline std::span<const int> probe(const std::vector<int>& v) { return v; }\n")
emitted(control "${control_source}" control)
if(NOT control MATCHES "${pattern}")
  message(STATUS "SKIP: this standard library does not name a vector's ranges::begin as libstdc++ does")
  return()
endif()
foreach(umbrella cache serving kvpager)
  emitted(${umbrella} "#include <kvpager/${umbrella}.hpp>\n" syms)
  if(syms MATCHES "${pattern}")
    string(REGEX MATCH "[^\n]*${pattern}[^\n]*" line "${syms}")
    message(FATAL_ERROR "kvpager/${umbrella}.hpp converts a vector to a span in non-dependent code (use "
                        "detail::span_of):\n${line}")
  endif()
endforeach()
message(STATUS "span conversions: no umbrella converts a vector to a span in code every including unit compiles")
