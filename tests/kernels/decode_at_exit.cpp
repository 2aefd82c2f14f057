// SPDX-License-Identifier: Apache-2.0
// Issue 9, item 15: a decode called from a static object's destructor used the CPU kernels' worker pool (and the
// calling thread's thread_local buffers) after they were freed at exit (ASan: heap-use-after-free in
// worker_pool.hpp). This program's static `caller` is constructed before the first decode call, so it is destroyed
// after the pool was shut down and after the main thread's thread_locals: its destructor decodes on all cores, with
// and without splits, and checks that both calls succeed and agree. Exit status 0 only if every check held, in main
// and in the destructor; the sanitizer build turns any use after free into a failure. With --only-at-exit, main does
// not decode: the destructor's call is the process's first (the pool is then started during exit).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kvpager_testing/decode_problem.hpp"

namespace {

/// Four sequences of 1000 tokens, 8 query heads on 2 KV heads (enough work to wake every worker), decoded on all cores
/// without splits and with 3; both must succeed with the same output and LSE.
bool decode_agrees(const char* when) {
  using kvpager_gpu_check::decode_problem;
  const decode_problem whole(KVPAGER_DTYPE_FP32, 64, 16, 8, 2, {1000, 1000, 999, 1000}, 1, 7);
  const decode_problem split(KVPAGER_DTYPE_FP32, 64, 16, 8, 2, {1000, 1000, 999, 1000}, 3, 7);
  const auto diff = whole.compare(split.cpu_out, split.cpu_lse);
  const bool ok = whole.cpu_ok && split.cpu_ok && diff.out <= 1e-5 && diff.lse <= 1e-5;
  if (!ok) std::fprintf(stderr, "decode %s: wrong status or output\n", when);
  return ok;
}

struct decodes_in_destructor {
  decodes_in_destructor() = default;
  decodes_in_destructor(const decodes_in_destructor&) = delete;
  decodes_in_destructor& operator=(const decodes_in_destructor&) = delete;
  ~decodes_in_destructor() {
    if (!decode_agrees("from a static destructor")) std::_Exit(1);
    std::puts("decode from a static destructor: OK");
  }
};
const decodes_in_destructor caller;  // constructed before main, so destroyed after the kernels' pool

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--only-at-exit") == 0) return 0;
  return decode_agrees("in main") ? 0 : 1;
}
