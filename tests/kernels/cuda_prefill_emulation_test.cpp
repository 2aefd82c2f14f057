// SPDX-License-Identifier: Apache-2.0
// The CUDA prefill kernels (kernels/cuda/device_prefill.cuh) compiled as plain C++ over the emulation of the CUDA
// execution model (cuda_emulation.hpp), the tensor-core fragments through their scalar stand-in, run on CPU threads
// against an fp64 reference and against the CPU backend (kvpager_cpu_paged_attention_prefill, within gpu_tolerance):
// every dtype and head dim, with and without a sliding window and a soft cap, GQA, empty and decode-like query
// ranges, several tiles per sequence and fewer CTAs than tiles, with the LSE output; and the device-side checks of
// the rows and block ids. Only a GPU run (tests/kernels/cuda_test.cpp) checks what nvcc and the tensor cores make of it.
#include "cuda_emulation.hpp"

#include "kernels/common/checks.hpp"
#include "kernels/cuda/device_prefill.cuh"
#include "kvpager_testing/decode_problem.hpp"
#include "kvpager_testing/prefill_cpu_compare.hpp"
#include "kvpager_testing/prefill_problem.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

using kvpager_gpu_check::compare_with_cpu;
using kvpager_gpu_check::gpu_tolerance;
using kvpager_gpu_check::prefill_problem;
namespace kk = kvpager::kernels::detail;

double tolerance(int32_t dtype) { return dtype == KVPAGER_DTYPE_FP32 ? 1e-5 : dtype == KVPAGER_DTYPE_FP16 ? 2e-3 : 1.6e-2; }
/// The LSE is computed in fp32 from scores of the rounded query and KV (the same as the reference's): fp32 rounding of
/// the dot products, the online max and the sum only; P rounded to T does not enter it.
constexpr double kLseTolerance = 2e-4;

template <class T>
void launch_attention(const kk::prefill_params& a, unsigned ctas) {
  const dim3 grid(ctas), block(kk::kPrefillWarps * 32);
  switch (a.d) {
    case 64: kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<T, 64>, a); break;
    case 80: kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<T, 80>, a); break;
    case 96: kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<T, 96>, a); break;
    case 112: kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<T, 112>, a); break;
    case 128: kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<T, 128>, a); break;
    default: kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<T, 256>, a); break;
  }
}

/// kvpager_cuda_paged_attention_prefill as kernels/cuda/prefill.cu writes it (host checks, prepare kernel, attention
/// kernel), on the emulation; the status the kernels flag comes back in *error.
int32_t emulated_prefill(void* out, float* lse, const void* q, const void* kv, const int32_t* indptr, const int32_t* table,
                         const int32_t* lens, int32_t num_seqs, int32_t hq, int32_t hkv, int32_t d, int32_t bs,
                         int32_t maxb, int32_t nb, float scale, int32_t window, float cap, int32_t dtype,
                         int32_t num_ctas, void* ws, int64_t ws_bytes, int32_t* error) {
  if (num_ctas < 1 || ws_bytes < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = kk::check_dense_prefill(out, q, kv, indptr, table, lens, num_seqs, hq, hkv, d, bs, maxb, nb,
                                                scale, window, cap, dtype, dtype, 1.0F, 1.0F);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_seqs == 0) return KVPAGER_STATUS_OK;
  if (ws == nullptr || ws_bytes < kk::prefill_workspace_bytes(num_seqs)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  const kk::prefill_params a{out, q, kv, indptr, table, lens, static_cast<int64_t*>(ws), num_seqs, hq, hkv, d, bs,
                             maxb, nb, scale, window, cap, error, lse, 1.0F};
  kvpager_emulation::launch(dim3(1), dim3(kk::kPrefillPrepThreads), kk::prefill_prepare_kernel<>, a);
  const auto ctas = static_cast<unsigned>(num_ctas);
  switch (dtype) {
    case KVPAGER_DTYPE_FP32:
      kvpager_emulation::launch(dim3(ctas), dim3(kk::kPrefillWarps * 32), kk::prefill_simt_kernel<float>, a);
      break;
    case KVPAGER_DTYPE_FP16: launch_attention<__half>(a, ctas); break;
    default: launch_attention<__nv_bfloat16>(a, ctas); break;
  }
  return KVPAGER_STATUS_OK;
}

struct emulated {
  int32_t rc = 0, error = 0;
  std::vector<unsigned char> out;
  std::vector<float> lse;  ///< [rows, hq], NaN where not written; empty when run without LSE
};

emulated run(const prefill_problem& pr, int32_t num_ctas, const std::vector<int32_t>* table = nullptr,
             const std::vector<int32_t>* indptr = nullptr, const std::vector<int32_t>* lens = nullptr,
             bool with_lse = true) {
  emulated r;
  r.out.assign(pr.q.size(), 0xFF);  // NaN in every dtype: every row must be written
  if (with_lse) r.lse.assign(static_cast<size_t>(pr.rows) * static_cast<size_t>(pr.hq), NAN);
  std::vector<int64_t> ws(static_cast<size_t>(pr.S) + 1, -7);
  r.rc = emulated_prefill(r.out.data(), with_lse ? r.lse.data() : nullptr, pr.q.data(), pr.kv.data(), (indptr ? *indptr : pr.indptr).data(),
                          (table ? *table : pr.table).data(), (lens ? *lens : pr.lens).data(), pr.S, pr.hq, pr.hkv,
                          pr.d, pr.bs, pr.maxb, pr.nb, pr.scale, pr.window_left, pr.cap, pr.dtype, num_ctas, ws.data(),
                          static_cast<int64_t>(ws.size() * 8), &r.error);
  return r;
}

}  // namespace

TEST(CudaPrefillEmulation, MatchesFp64ReferenceForEveryDtypeHeadDimWindowAndCap) {
  // (seq_len, q_len): a whole prompt, an extension over a cached prefix (several tiles), no new token, a decode-like
  // single token, a one-token prompt.
  const std::pair<int32_t, int32_t> heads[] = {{8, 2}, {4, 4}, {6, 1}};
  const int32_t block_sizes[] = {8, 16, 32};
  uint32_t seed = 1;
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 96, 112, 128, 256}) {
      const uint32_t k = seed++;
#if defined(KVPAGER_TEST_REDUCED)
      if (k % 3 != 1) continue;  // sanitizer and no-exception builds: a third of the matrix, every dtype
#endif
      const auto [hq, hkv] = heads[k % 3];
      const int32_t bs = block_sizes[(k / 3) % 3];
      const int32_t window = k % 2 == 0 ? 19 : -1;
      const float cap = (k / 2) % 2 == 0 ? 0.0F : 1.5F;  // small cap: tanh bites on most scores
      const prefill_problem pr(dtype, d, bs, hq, hkv, window, cap, {{37, 37}, {90, 41}, {12, 0}, {45, 1}, {1, 1}}, k);
      const emulated r = run(pr, 3);
      const auto what = ::testing::Message() << "dtype " << dtype << " d " << d << " bs " << bs << " hq " << hq
                                             << " hkv " << hkv << " window " << window << " cap " << cap;
      EXPECT_EQ(r.rc, KVPAGER_STATUS_OK) << what;
      EXPECT_EQ(r.error, 0) << what;
      EXPECT_LE(pr.compare(r.out), tolerance(dtype)) << what;
      EXPECT_LE(pr.compare_lse(r.lse), kLseTolerance) << what;
      EXPECT_LE(compare_with_cpu(pr, r.out), gpu_tolerance(dtype)) << what << " (against the CPU backend)";
    }
}

TEST(CudaPrefillEmulation, WindowAndCapCombinationsAndGridSizes) {
  int32_t i = 0;
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_BF16})
    for (int32_t window : {-1, 0, 5, 200})
      for (float cap : {0.0F, 4.0F}) {
        const int32_t ctas = ++i % 2 == 0 ? 1 : 7;  // one CTA walking every tile, or more CTAs than tiles
#if defined(KVPAGER_TEST_REDUCED)
        if (i % 3 != 0 && window != 0) continue;  // sanitizer and no-exception builds: a third, every window kept
#endif
        const prefill_problem pr(dtype, 64, 16, 4, 2, window, cap, {{70, 70}, {33, 9}}, 40U + static_cast<uint32_t>(i));
        const emulated r = run(pr, ctas);
        EXPECT_EQ(r.error, 0);
        EXPECT_LE(pr.compare(r.out), tolerance(dtype)) << dtype << " window " << window << " cap " << cap << " ctas " << ctas;
        EXPECT_LE(pr.compare_lse(r.lse), kLseTolerance) << dtype << " window " << window << " cap " << cap;
        EXPECT_LE(compare_with_cpu(pr, r.out), gpu_tolerance(dtype))
            << dtype << " window " << window << " cap " << cap << " ctas " << ctas << " (against the CPU backend)";
      }
}

// Scores far apart: the running max rises by more than the rescale threshold in later chunks (the lazy rescale of
// O must be exact), and the first chunk's max is far below the last's.
TEST(CudaPrefillEmulation, RisingScoresRescaleExactly) {
  prefill_problem pr(KVPAGER_DTYPE_FP16, 64, 8, 2, 1, -1, 0.0F, {{96, 8}}, 77, false);
  pr.scale = 4.0F;  // scores of up to ~60: several rescales along the sequence
  pr.compute_reference();
  const emulated r = run(pr, 2);
  EXPECT_EQ(r.error, 0);
  EXPECT_LE(pr.compare(r.out), tolerance(KVPAGER_DTYPE_FP16));
  // The LSE comes from the lazily raised reference max and its sum: still the true log-sum-exp.
  EXPECT_LE(pr.compare_lse(r.lse), kLseTolerance);
  EXPECT_LE(compare_with_cpu(pr, r.out), gpu_tolerance(KVPAGER_DTYPE_FP16)) << "against the CPU backend";
}

TEST(CudaPrefillEmulation, BadBlockIdIsFlaggedAndNeverRead) {
  // The pool holds exactly nb blocks: with ASan, a read of block nb (or of a negative one) would be reported.
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16}) {
    const prefill_problem pr(dtype, 64, 16, 4, 2, -1, 0.0F, {{40, 20}, {20, 20}}, 5);
    for (int32_t bad : {pr.nb, -1}) {
      auto table = pr.table;
      table[1] = bad;  // second block of the first sequence
      const emulated r = run(pr, 2, &table, nullptr, nullptr, /*with_lse=*/false);  // and no LSE requested
      EXPECT_EQ(r.error, KVPAGER_STATUS_INVALID_BLOCK) << bad;
      // The second sequence does not use the bad entry: its rows still match.
      const size_t first = static_cast<size_t>(pr.indptr[1]) * static_cast<size_t>(pr.hq * pr.d);
      for (size_t i = first; i < pr.ref.size(); ++i)
        ASSERT_NEAR(pr.value(r.out, i), pr.ref[i], tolerance(dtype) * (1 + std::abs(pr.ref[i]))) << i;
    }
  }
}

TEST(CudaPrefillEmulation, BadRowsAreFlaggedOnTheDevice) {
  const prefill_problem pr(KVPAGER_DTYPE_FP16, 64, 16, 4, 2, -1, 0.0F, {{40, 20}, {20, 20}}, 6);
  const size_t first = static_cast<size_t>(pr.indptr[1]) * static_cast<size_t>(pr.hq * pr.d);
  {  // a q_len above its seq_len: INVALID_ARGUMENT, its rows zero, the other sequence intact
    auto lens = pr.lens;
    lens[0] = 19;
    const emulated r = run(pr, 2, nullptr, nullptr, &lens);
    EXPECT_EQ(r.error, KVPAGER_STATUS_INVALID_ARGUMENT);
    for (size_t i = 0; i < first; ++i) ASSERT_EQ(pr.value(r.out, i), 0.0) << i;
    for (size_t i = first; i < pr.ref.size(); ++i) ASSERT_NEAR(pr.value(r.out, i), pr.ref[i], 2e-3 * (1 + std::abs(pr.ref[i])));
  }
  {  // a seq_len beyond its page table row: SEQ_TOO_LONG, its rows zero
    auto lens = pr.lens;
    lens[1] = pr.maxb * pr.bs + 1;
    const emulated r = run(pr, 2, nullptr, nullptr, &lens);
    EXPECT_EQ(r.error, KVPAGER_STATUS_SEQ_TOO_LONG);
    for (size_t i = first; i < pr.ref.size(); ++i) ASSERT_EQ(pr.value(r.out, i), 0.0) << i;
    for (size_t i = first / static_cast<size_t>(pr.d); i < r.lse.size(); ++i) ASSERT_EQ(r.lse[i], -INFINITY) << i;
  }
  {  // qo_indptr[0] != 0: nothing computed, nothing written
    auto indptr = pr.indptr;
    indptr[0] = 1;
    const emulated r = run(pr, 2, nullptr, &indptr);
    EXPECT_EQ(r.error, KVPAGER_STATUS_INVALID_ARGUMENT);
    for (unsigned char b : r.out) ASSERT_EQ(b, 0xFF);
  }
  {  // a decreasing qo_indptr: flagged, that sequence skipped
    auto indptr = pr.indptr;
    indptr[1] = 41;
    indptr[2] = 40;
    const emulated r = run(pr, 2, nullptr, &indptr);
    EXPECT_EQ(r.error, KVPAGER_STATUS_INVALID_ARGUMENT);
  }
}

// The host checks of the CUDA entry point, in the CPU function's order, before anything is launched.
TEST(CudaPrefillEmulation, HostChecksRefuseBeforeAnyLaunch) {
  const prefill_problem pr(KVPAGER_DTYPE_FP16, 64, 16, 4, 2, -1, 0.0F, {{20, 20}}, 8);
  std::vector<unsigned char> out(pr.q.size(), 0xAB);
  std::vector<int64_t> ws(2, 0);
  int32_t error = 0;
  auto call = [&](int32_t hq, int32_t hkv, int32_t d, int32_t bs, int32_t maxb, float scale, int32_t window, float cap,
                  int32_t dtype, int32_t ctas, int64_t ws_bytes, const void* q = nullptr) {
    return emulated_prefill(out.data(), nullptr, q ? q : pr.q.data(), pr.kv.data(), pr.indptr.data(), pr.table.data(),
                            pr.lens.data(), pr.S, hq, hkv, d, bs, maxb, pr.nb, scale, window, cap, dtype, ctas, ws.data(),
                            ws_bytes, &error);
  };
  const float s = pr.scale;
  EXPECT_EQ(call(4, 2, 64, 16, pr.maxb, s, -1, 0, 1, 0, 16), KVPAGER_STATUS_INVALID_ARGUMENT);      // no CTA
  EXPECT_EQ(call(4, 2, 64, 16, 0, s, -1, 0, 1, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT);            // max_blocks 0
  EXPECT_EQ(call(4, 2, 64, 16, pr.maxb, NAN, -1, 0, 1, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT);    // scale
  EXPECT_EQ(call(4, 2, 64, 16, pr.maxb, s, -2, 0, 1, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT);      // window
  EXPECT_EQ(call(4, 2, 64, 16, pr.maxb, s, -1, INFINITY, 1, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT);  // cap
  EXPECT_EQ(call(4, 2, 64, 16, pr.maxb, s, -1, -1.0F, 1, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT);     // cap < 0
  EXPECT_EQ(call(3, 2, 64, 16, pr.maxb, s, -2, 0, 1, 1, 16), KVPAGER_STATUS_BAD_HEADS);  // heads before the window
  EXPECT_EQ(call(3, 2, 64, 16, pr.maxb, s, -1, 0, 1, 1, 16), KVPAGER_STATUS_BAD_HEADS);
  EXPECT_EQ(call(4, 2, 72, 16, pr.maxb, s, -1, 0, 1, 1, 16), KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM);
  EXPECT_EQ(call(4, 2, 64, 16, pr.maxb, s, -1, 0, 3, 1, 16), KVPAGER_STATUS_UNSUPPORTED_DTYPE);
  EXPECT_EQ(call(4, 2, 64, 12, pr.maxb, s, -1, 0, 1, 1, 16), KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE);
  EXPECT_EQ(call(4, 2, 64, 16, pr.maxb, s, -1, 0, 1, 1, 15), KVPAGER_STATUS_INVALID_ARGUMENT);      // workspace
  EXPECT_EQ(emulated_prefill(out.data(), nullptr, nullptr, pr.kv.data(), pr.indptr.data(), pr.table.data(), pr.lens.data(), pr.S,
                             4, 2, 64, 16, pr.maxb, pr.nb, s, -1, 0, 1, 1, ws.data(), 16, &error),
            KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(error, 0);
  for (unsigned char b : out) ASSERT_EQ(b, 0xAB) << "a refused call wrote its output";
  // Nothing to do: OK with every pointer null.
  EXPECT_EQ(emulated_prefill(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 4, 2, 64, 16, 1, 1, s, -1, 0, 1, 1,
                             nullptr, 0, nullptr),
            KVPAGER_STATUS_OK);
}

// check_prefill_rows: the host-side row checks the CPU backend runs (the CUDA prepare kernel flags the same):
// qo_indptr whole first, then per sequence its length and its q_len.
TEST(CudaPrefillEmulation, HostRowChecksInOrder) {
  const std::vector<int32_t> lens = {10, 20};
  int64_t total = -1;
  auto rows = [&](std::vector<int32_t> indptr, std::vector<int32_t> l, int32_t maxb = 2) {
    return kk::check_prefill_rows(indptr.data(), l.data(), 2, 4, 64, 16, maxb, KVPAGER_DTYPE_FP16, &total);
  };
  EXPECT_EQ(rows({0, 10, 30}, lens), KVPAGER_STATUS_OK);
  EXPECT_EQ(total, 30);
  EXPECT_EQ(rows({0, 0, 0}, lens), KVPAGER_STATUS_OK);
  EXPECT_EQ(rows({1, 10, 30}, lens), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(rows({0, 10, 5}, lens), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(rows({0, 11, 30}, lens), KVPAGER_STATUS_INVALID_ARGUMENT);  // q_len above seq_len
  EXPECT_EQ(rows({0, 10, 30}, {10, 33}), KVPAGER_STATUS_SEQ_TOO_LONG);
  EXPECT_EQ(rows({0, 10, 30}, {-1, 20}), KVPAGER_STATUS_SEQ_TOO_LONG);
  // qo_indptr is checked whole before any length: sequence 1's decrease is found before sequence 0's bad length.
  EXPECT_EQ(rows({0, 10, 5}, {40, 20}), KVPAGER_STATUS_INVALID_ARGUMENT);
  // Per sequence, its length before its q_len: sequence 0's q_len above its length before sequence 1's bad length.
  EXPECT_EQ(rows({0, 11, 30}, {10, 40}), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kk::check_prefill_rows(nullptr, nullptr, 0, 4, 64, 16, 1, KVPAGER_DTYPE_FP16, &total), KVPAGER_STATUS_OK);
}

// Issue 21, point 5 on the CUDA kernels: a position outside a row's window (after it, or before its window) never
// reaches that row, whatever K and V hold there. The tensor-core kernel used to add 0 x V for a masked position in a
// 16-token slice that other rows of the warp see, so an inf or NaN there turned the row into NaN; such mixed slices
// are now added exactly. For each checked row, every position outside its window is poisoned in K and V.
TEST(CudaPrefillEmulation, MaskedPositionsNeverReachARow) {
  for (const int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (const int32_t window : {-1, 6})
      for (const bool nan : {false, true}) {
        const prefill_problem pr(dtype, 64, 16, 4, 2, window, window < 0 ? 0.0F : 10.0F, {{80, 64}}, 9000U);
        const uint16_t poison16 = dtype == KVPAGER_DTYPE_FP16 ? (nan ? 0x7E00 : 0x7C00) : (nan ? 0x7FC0 : 0x7F80);
        const float poison32 = nan ? NAN : INFINITY;
        for (const int32_t r : {0, 5, 16, 31, 40, 63}) {
          std::vector<unsigned char> kv = pr.kv;
          const int64_t pos = 80 - 64 + r;
          for (int32_t j = 0; j < 80; ++j) {
            if (j <= pos && (window < 0 || j >= pos - window)) continue;
            for (int32_t h = 0; h < pr.hkv; ++h)
              for (int v = 0; v < 2; ++v)
                for (int32_t e = 0; e < pr.d; ++e) {
                  const size_t i = pr.kv_index(0, h, j, v) + static_cast<size_t>(e);
                  if (dtype == KVPAGER_DTYPE_FP32) {
                    std::memcpy(kv.data() + 4 * i, &poison32, 4);
                  } else {
                    std::memcpy(kv.data() + 2 * i, &poison16, 2);
                  }
                }
          }
          std::vector<unsigned char> out(pr.q.size(), 0xFF);
          std::vector<int64_t> ws(2, -7);
          int32_t error = 0;
          ASSERT_EQ(emulated_prefill(out.data(), nullptr, pr.q.data(), kv.data(), pr.indptr.data(), pr.table.data(),
                                     pr.lens.data(), pr.S, pr.hq, pr.hkv, pr.d, pr.bs, pr.maxb, pr.nb, pr.scale,
                                     pr.window_left, pr.cap, dtype, 2, ws.data(), 16, &error),
                    KVPAGER_STATUS_OK);
          ASSERT_EQ(error, 0);
          for (int32_t h = 0; h < pr.hq; ++h)
            for (int32_t e = 0; e < pr.d; ++e) {
              const size_t i = (static_cast<size_t>(r) * static_cast<size_t>(pr.hq) + static_cast<size_t>(h)) *
                                   static_cast<size_t>(pr.d) + static_cast<size_t>(e);
              const double got = pr.value(out, i), want = pr.ref[i];
              ASSERT_TRUE(std::isfinite(got)) << "row " << r << " saw a poisoned position: dtype " << dtype
                                              << " window " << window << (nan ? " NaN" : " inf");
              ASSERT_LE(std::abs(got - want) / (1.0 + std::abs(want)), tolerance(dtype))
                  << "row " << r << " head " << h << " dtype " << dtype << " window " << window;
            }
        }
      }
}
