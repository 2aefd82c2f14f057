# SPDX-License-Identifier: Apache-2.0
# kvpager_add_doc_snippets(<markdown file> <name>): every ```cpp block of the Markdown file becomes a program that
# is compiled with kvpager's strict warnings (-Wconversion, -Wsign-conversion, ..., -Werror) and run as the test
# docs.<name>.snippet_<n> (n counts from 1 in the file). So the documentation's code is the code that compiles.
#
# How a block becomes a program:
# - its `#include` lines go first, after an implicit `#include <kvpager/kvpager.hpp>` and the std headers the
#   README's fragments use (<cstdint>, <cstdio>, <span>, <vector>);
# - a block that defines `int main(` is compiled as it is (types, policies, functions at namespace scope);
# - any other block is the body of `int main()`, which then returns 0;
# - a block that includes a kvpager/kernels/ header links the compiled kernels (kvpager::kernels).
# `#line` directives map the program back to the Markdown file, so an error names the README's own line. The
# blocks are read when CMake configures; editing the Markdown file reconfigures.
function(kvpager_add_doc_snippets md name)
  get_filename_component(md "${md}" ABSOLUTE)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${md}")
  file(READ "${md}" text)
  set(out_dir "${CMAKE_CURRENT_BINARY_DIR}/doc_snippets/${name}")
  file(MAKE_DIRECTORY "${out_dir}")
  set(fence_re "(^|\n)```(cpp|c\\+\\+)[ \t]*\n")
  set(pos 0)
  set(n 0)
  string(LENGTH "${text}" total)
  while(TRUE)
    string(SUBSTRING "${text}" ${pos} -1 rest)
    string(REGEX MATCH "${fence_re}" fence "${rest}")
    if(NOT fence)
      break()
    endif()
    string(FIND "${rest}" "${fence}" at)
    string(LENGTH "${fence}" fence_len)
    math(EXPR code_begin "${pos} + ${at} + ${fence_len}")
    string(SUBSTRING "${text}" ${code_begin} -1 after)
    string(FIND "${after}" "\n```" code_len)
    if(code_len EQUAL -1)
      message(FATAL_ERROR "${md}: a ```cpp block is never closed")
    endif()
    string(SUBSTRING "${after}" 0 ${code_len} code)
    # The line of the block's first code line: newlines before it, plus one.
    string(SUBSTRING "${text}" 0 ${code_begin} before)
    string(REGEX MATCHALL "\n" newlines "${before}")
    list(LENGTH newlines line)
    math(EXPR line "${line} + 1")
    math(EXPR pos "${code_begin} + ${code_len} + 4")
    math(EXPR n "${n} + 1")

    # Hoist the includes (blank lines keep the line numbers), then wrap the rest unless it has its own main.
    string(REGEX MATCHALL "(^|\n)[ \t]*#[ \t]*include[^\n]*" includes "${code}")
    string(REGEX REPLACE "(^|\n)[ \t]*#[ \t]*include[^\n]*" "\\1" body "${code}")
    string(REPLACE "\n" "" includes "${includes}")
    string(REPLACE ";" "\n" includes "${includes}")
    set(program "// Generated from ${md}, ```cpp block ${n} (line ${line}). Do not edit: edit the Markdown file.\n")
    string(APPEND program "#include <kvpager/kvpager.hpp>\n\n#include <cstdint>\n#include <cstdio>\n#include <span>\n"
                          "#include <vector>\n${includes}\n")
    if(body MATCHES "(^|\n)int main\\(")
      string(APPEND program "#line ${line} \"${md}\"\n${body}\n")
    else()
      string(APPEND program "int main() {\n#line ${line} \"${md}\"\n${body}\n  return 0;\n}\n")
    endif()
    set(src "${out_dir}/snippet_${n}.cpp")
    # Rewrite only on change, so an unrelated README edit does not rebuild every snippet.
    set(old "")
    if(EXISTS "${src}")
      file(READ "${src}" old)
    endif()
    if(NOT old STREQUAL program)
      file(WRITE "${src}" "${program}")
    endif()

    set(target doc_${name}_snippet_${n})
    add_executable(${target} "${src}")
    target_link_libraries(${target} PRIVATE kvpager::kvpager kvpager_strict_warnings)
    if(includes MATCHES "kvpager/kernels/")  # a block that calls the compiled kernels links them
      if(NOT TARGET kvpager_kernels)
        message(FATAL_ERROR "${md}: ```cpp block ${n} includes a kernels header, and the kernels are not built")
      endif()
      target_link_libraries(${target} PRIVATE kvpager::kernels)
    endif()
    target_compile_definitions(${target} PRIVATE KVPAGER_ENABLE_ASSERTS=1)
    add_test(NAME docs.${name}.snippet_${n} COMMAND ${target})
  endwhile()
  if(n EQUAL 0)
    message(FATAL_ERROR "${md}: no ```cpp block found; the documentation check would check nothing")
  endif()
  # A stale generated file from a block since removed would only confuse a reader of the build tree.
  file(GLOB generated "${out_dir}/snippet_*.cpp")
  foreach(g IN LISTS generated)
    string(REGEX MATCH "snippet_([0-9]+)\\.cpp$" _ "${g}")
    if(CMAKE_MATCH_1 GREATER n)
      file(REMOVE "${g}")
    endif()
  endforeach()
endfunction()
