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

/// The first KV position the one query of a decode sees in a sequence of `len` tokens: the query sits at
/// p = len - 1 and, with window_left >= 0, attends to positions j >= p - window_left; -1 (no window) gives 0.
KVPAGER_HOST_DEVICE inline int32_t window_start(int32_t len, int32_t window_left) {
  if (window_left < 0) return 0;
  const int64_t first = static_cast<int64_t>(len) - 1 - window_left;
  return first > 0 ? static_cast<int32_t>(first) : 0;
}

/// split_range over the tokens [w0, len) of a windowed sequence: the splits cut whole blocks counted from the block
/// that holds w0, and the first one starts at w0 itself, so no split reads a block that lies entirely before the
/// window. With w0 = 0 it is split_range.
KVPAGER_HOST_DEVICE inline void split_range_from(int32_t w0, int32_t len, int32_t bs, int32_t splits, int32_t split,
                                                 int32_t& t0, int32_t& t1) {
  const int32_t first = w0 / bs * bs;
  split_range(len - first, bs, splits, split, t0, t1);
  t0 += first;
  t1 += first;
  if (t0 < w0) t0 = w0;  // only the first split: its end is at least one block past `first`, so t1 > w0
}

/// A scaled score after the logit soft cap: cap * tanh(s / cap) when cap > 0, s itself when cap is 0; within a few
/// ulp of the exact value for every finite cap (the CPU kernels' vsoftcap is the same function). Where |s / cap| is
/// below 2^-12, tanh(y) = y (1 - y^2 / 3 + ...) differs from y by less than half an ulp, so the result is s itself:
/// cap * tanhf(s / cap) would round s / cap to a subnormal, and lose s's low bits, for caps near FLT_MAX.
KVPAGER_HOST_DEVICE inline float soft_cap(float s, float cap) {
  if (!(cap > 0.0F)) return s;
  const float y = s / cap;
  return fabsf(y) < 0x1p-12F ? s : cap * tanhf(y);
}

/// Natural log of the softmax denominator of the scaled scores, from the running max m and the sum l of exp(s - m);
/// -inf for an empty sequence (l = 0).
KVPAGER_HOST_DEVICE inline float lse_of(float m, float l) { return l > 0.0F ? m + logf(l) : -INFINITY; }

}  // namespace kvpager::kernels::detail
