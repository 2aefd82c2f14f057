// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU backend's answer to a prefill_problem (kvpager_cpu_paged_attention_prefill on the same dense HND pool,
// tables and query) and the comparison of another backend's output with it: the CUDA prefill under emulation
// (tests/kernels/cuda_prefill_emulation_test.cpp) and on a GPU (tests/kernels/cuda_test.cpp) are checked against the
// CPU backend as well as against the fp64 reference, as decode is. Needs libkvpager_kernels.
#include <kvpager/c/kernels.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kvpager_testing/prefill_problem.hpp"

namespace kvpager_gpu_check {

/// kvpager_cpu_paged_attention_prefill's output for `pr` (every row written: the buffer starts as NaN in every
/// dtype); *rc gets its status.
inline std::vector<unsigned char> cpu_prefill_output(const prefill_problem& pr, int32_t* rc) {
  std::vector<unsigned char> out(pr.q.size(), 0xFF);
  *rc = kvpager_cpu_paged_attention_prefill(out.data(), pr.q.data(), pr.kv.data(), pr.indptr.data(), pr.table.data(),
                                            pr.lens.data(), pr.S, pr.hq, pr.hkv, pr.d, pr.bs, pr.maxb, pr.nb, pr.scale,
                                            pr.window_left, pr.cap, pr.dtype, 0);
  return out;
}

/// Worst relative difference |cpu - out| / (1 + |cpu|) of an output of `pr` against the CPU backend's on the same
/// problem; 1e9 when either holds a NaN or the CPU call failed.
inline double compare_with_cpu(const prefill_problem& pr, const std::vector<unsigned char>& out) {
  int32_t rc = 0;
  const std::vector<unsigned char> cpu = cpu_prefill_output(pr, &rc);
  if (rc != KVPAGER_STATUS_OK || out.size() != cpu.size()) return 1e9;
  double worst = 0;
  for (size_t i = 0; i < out.size() / pr.esz(); ++i) {
    const double a = pr.value(cpu, i), b = pr.value(out, i);
    worst = std::max(worst, std::isnan(a) || std::isnan(b) ? 1e9 : std::abs(a - b) / (1.0 + std::abs(a)));
  }
  return worst;
}

}  // namespace kvpager_gpu_check
