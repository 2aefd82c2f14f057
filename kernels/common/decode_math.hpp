// SPDX-License-Identifier: Apache-2.0
#pragma once
// Two rules of split-KV decode that the CPU backend and the CUDA kernels must apply identically: how a sequence is
// cut into splits, and how a softmax state (max, denominator) becomes the LSE output. Host and device code.
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define KVPAGER_HOST_DEVICE __host__ __device__
#else
#define KVPAGER_HOST_DEVICE
#endif

namespace kvpager::kernels::detail {

/// The tokens [t0, t1) that split `split` of `splits` reads from a sequence of `len` tokens: equal chunks of whole
/// blocks of `bs` tokens (trailing splits may be empty). Computed in 64 bits: len may be close to INT32_MAX.
KVPAGER_HOST_DEVICE inline void split_range(int32_t len, int32_t bs, int32_t splits, int32_t split, int32_t& t0,
                                            int32_t& t1) {
  const int64_t per = (static_cast<int64_t>(len) + splits - 1) / splits;
  const int64_t chunk = (per + bs - 1) / bs * bs;
  const int64_t start = static_cast<int64_t>(split) * chunk < len ? static_cast<int64_t>(split) * chunk : len;
  t0 = static_cast<int32_t>(start);
  t1 = static_cast<int32_t>(start + chunk < len ? start + chunk : len);
}

/// Natural log of the softmax denominator of the scaled scores, from the running max m and the sum l of exp(s - m);
/// -inf for an empty sequence (l = 0).
KVPAGER_HOST_DEVICE inline float lse_of(float m, float l) { return l > 0.0F ? m + logf(l) : -INFINITY; }

}  // namespace kvpager::kernels::detail
