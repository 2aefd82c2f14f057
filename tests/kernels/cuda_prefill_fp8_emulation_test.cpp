// SPDX-License-Identifier: Apache-2.0
// The CUDA prefill over an fp8 E4M3 pool (kvpager_cuda_paged_attention_prefill_fp8: device_prefill.cuh's kernels
// with KV = uint8_t) compiled as plain C++ over the emulation of the CUDA execution model (cuda_emulation.hpp), run on
// CPU threads against an fp64 reference computed from the stored fp8 values times their scales: every query dtype
// (fp16/bf16 on the tensor-core kernel, fp32 on the CUDA-core one), a few head dims (a lean set: each is a template
// instantiation), windows, soft caps, the LSE output; the host checks in their order, and a bad block id.
#include "cuda_emulation.hpp"

#include "kernels/common/checks.hpp"
#include "kernels/cuda/device_prefill.cuh"
#include "kvpager_testing/prefill_problem.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

using kvpager_gpu_check::prefill_problem;
namespace kk = kvpager::kernels::detail;

double tolerance(int32_t dtype) { return dtype == KVPAGER_DTYPE_FP32 ? 1e-5 : dtype == KVPAGER_DTYPE_FP16 ? 2e-3 : 1.6e-2; }
constexpr double kLseTolerance = 2e-4;
constexpr float kKScale = 0.01F, kVScale = 0.05F;  // K in [-2, 2] stored up to +-200, V up to +-40 (of 448)

template <class T>
void launch_mma_fp8(const kk::prefill_params& a, unsigned ctas) {
  const dim3 grid(ctas), block(kk::kPrefillWarps * 32);
  switch (a.d) {  // the head dims this test runs (80: an odd count of 16-byte pieces per row)
    case 64: kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<T, 64, uint8_t>, a); break;
    case 80: kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<T, 80, uint8_t>, a); break;
    case 128: kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<T, 128, uint8_t>, a); break;
    default: kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<T, 256, uint8_t>, a); break;
  }
}

/// kvpager_cuda_paged_attention_prefill_fp8 as kernels/cuda/prefill.cu writes it, on the emulation.
int32_t emulated_prefill_fp8(void* out, float* lse, const void* q, const void* kv, const int32_t* indptr,
                             const int32_t* table, const int32_t* lens, int32_t num_seqs, int32_t hq, int32_t hkv,
                             int32_t d, int32_t bs, int32_t maxb, int32_t nb, float scale, int32_t window, float cap,
                             int32_t q_dtype, float k_scale, float v_scale, int32_t num_ctas, void* ws,
                             int64_t ws_bytes, int32_t* error) {
  if (num_ctas < 1 || ws_bytes < 0) return KVPAGER_STATUS_INVALID_ARGUMENT;
  if (const int32_t rc = kk::check_dense_prefill(out, q, kv, indptr, table, lens, num_seqs, hq, hkv, d, bs, maxb, nb,
                                                scale, window, cap, KVPAGER_DTYPE_FP8_E4M3,
                                                kk::fp8_entry_io_dtype(q_dtype), k_scale, v_scale);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_seqs == 0) return KVPAGER_STATUS_OK;
  if (ws == nullptr || ws_bytes < kk::prefill_workspace_bytes(num_seqs)) return KVPAGER_STATUS_INVALID_ARGUMENT;
  const kk::prefill_params a{out, q, kv, indptr, table, lens, static_cast<int64_t*>(ws), num_seqs, hq, hkv, d, bs,
                             maxb, nb, scale * k_scale, window, cap, error, lse, v_scale};
  kvpager_emulation::launch(dim3(1), dim3(kk::kPrefillPrepThreads), kk::prefill_prepare_kernel<>, a);
  const auto ctas = static_cast<unsigned>(num_ctas);
  switch (q_dtype) {
    case KVPAGER_DTYPE_FP32:
      kvpager_emulation::launch(dim3(ctas), dim3(kk::kPrefillWarps * 32), kk::prefill_simt_kernel<uint8_t>, a);
      break;
    case KVPAGER_DTYPE_FP16: launch_mma_fp8<__half>(a, ctas); break;
    default: launch_mma_fp8<__nv_bfloat16>(a, ctas); break;
  }
  return KVPAGER_STATUS_OK;
}

struct emulated {
  int32_t rc = 0, error = 0;
  std::vector<unsigned char> out;
  std::vector<float> lse;
};

emulated run(const prefill_problem& pr, int32_t num_ctas, const std::vector<int32_t>* table = nullptr) {
  emulated r;
  r.out.assign(pr.q.size(), 0xFF);  // NaN in every dtype: every row must be written
  r.lse.assign(static_cast<size_t>(pr.rows) * static_cast<size_t>(pr.hq), NAN);
  std::vector<int64_t> ws(static_cast<size_t>(pr.S) + 1, -7);
  r.rc = emulated_prefill_fp8(r.out.data(), r.lse.data(), pr.q.data(), pr.kv8.data(), pr.indptr.data(),
                              (table ? *table : pr.table).data(), pr.lens.data(), pr.S, pr.hq, pr.hkv, pr.d, pr.bs,
                              pr.maxb, pr.nb, pr.scale, pr.window_left, pr.cap, pr.dtype, pr.k_scale, pr.v_scale,
                              num_ctas, ws.data(), static_cast<int64_t>(ws.size() * 8), &r.error);
  return r;
}

}  // namespace

TEST(CudaPrefillFp8Emulation, MatchesFp64ReferenceFromStoredFp8) {
  const std::pair<int32_t, int32_t> heads[] = {{8, 2}, {4, 4}, {6, 1}};
  const int32_t block_sizes[] = {8, 16, 32};
  uint32_t seed = 100;
  for (int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 128, 256}) {
      const uint32_t k = seed++;
#if defined(KVPAGER_TEST_REDUCED)
      if (k % 2 != 0 && d != 80) continue;  // sanitizer and no-exception builds: about half, every dtype
#endif
      const auto [hq, hkv] = heads[k % 3];
      const int32_t bs = block_sizes[(k / 3) % 3];
      const int32_t window = k % 2 == 0 ? 19 : -1;
      const float cap = (k / 2) % 2 == 0 ? 0.0F : 1.5F;
      prefill_problem pr(q_dtype, d, bs, hq, hkv, window, cap, {{37, 37}, {90, 41}, {12, 0}, {45, 1}}, k, false);
      pr.use_fp8_kv(kKScale, kVScale);
      const emulated r = run(pr, 3);
      const auto what = ::testing::Message() << "q_dtype " << q_dtype << " d " << d << " bs " << bs << " hq " << hq
                                             << " hkv " << hkv << " window " << window << " cap " << cap;
      EXPECT_EQ(r.rc, KVPAGER_STATUS_OK) << what;
      EXPECT_EQ(r.error, 0) << what;
      EXPECT_LE(pr.compare(r.out), tolerance(q_dtype)) << what;
      EXPECT_LE(pr.compare_lse(r.lse), kLseTolerance) << what;
    }
}

// The scales are applied, not assumed: the same fp8 bytes read with other scales give the reference of those scales
// (k_scale changes the softmax's sharpness, v_scale the output's magnitude).
TEST(CudaPrefillFp8Emulation, ScalesFoldIntoScoreAndOutput) {
  for (int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_BF16}) {
    prefill_problem pr(q_dtype, 64, 16, 4, 2, -1, 0.0F, {{70, 70}, {33, 9}}, 7, false);
    pr.use_fp8_kv(kKScale, kVScale);
    const std::vector<unsigned char> bytes = pr.kv8;
    pr.k_scale = 4.0F * kKScale;
    pr.v_scale = 0.5F * kVScale;
    pr.compute_reference();  // over the same bytes with the new scales
    ASSERT_EQ(pr.kv8, bytes);
    const emulated r = run(pr, 2);
    EXPECT_EQ(r.error, 0);
    EXPECT_LE(pr.compare(r.out), tolerance(q_dtype)) << q_dtype;
    EXPECT_LE(pr.compare_lse(r.lse), kLseTolerance) << q_dtype;
  }
}

TEST(CudaPrefillFp8Emulation, BadBlockIdIsFlaggedAndNeverRead) {
  for (int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16}) {
    prefill_problem pr(q_dtype, 64, 16, 4, 2, -1, 0.0F, {{40, 20}, {20, 20}}, 5, false);
    pr.use_fp8_kv(kKScale, kVScale);
    auto table = pr.table;
    table[1] = pr.nb;  // the pool holds exactly nb blocks (ASan would see a read of block nb)
    const emulated r = run(pr, 2, &table);
    EXPECT_EQ(r.error, KVPAGER_STATUS_INVALID_BLOCK);
    const size_t first = static_cast<size_t>(pr.indptr[1]) * static_cast<size_t>(pr.hq * pr.d);
    for (size_t i = first; i < pr.ref.size(); ++i)
      ASSERT_NEAR(pr.value(r.out, i), pr.ref[i], tolerance(q_dtype) * (1 + std::abs(pr.ref[i]))) << i;
  }
}

// With unit scales, the fp8 kernels are the plain kernels over the decoded pool, bit for bit: the same pool stored as
// fp8 and as the query dtype (every e4m3 value is exact in fp32, fp16 and bf16) gives the same output and LSE bytes.
TEST(CudaPrefillFp8Emulation, UnitScalesEqualThePlainKernelOverTheDecodedPool) {
  for (int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16}) {
    prefill_problem pr(q_dtype, 64, 16, 4, 2, 9, 3.0F, {{70, 70}, {33, 9}}, 11, false);
    pr.use_fp8_kv(1.0F, 1.0F);
    const emulated fp8 = run(pr, 3);
    // The decoded pool in the query dtype.
    std::vector<unsigned char> plain_kv(pr.kv.size());
    for (size_t i = 0; i < pr.kv8.size(); ++i) {
      const float x = kvpager::detail::e4m3_to_float(pr.kv8[i]);
      if (q_dtype == KVPAGER_DTYPE_FP32) {
        std::memcpy(plain_kv.data() + 4 * i, &x, 4);
      } else {
        const uint16_t h = q_dtype == KVPAGER_DTYPE_FP16 ? kvpager::detail::float_to_half(x) : kvpager::detail::float_to_bf16(x);
        std::memcpy(plain_kv.data() + 2 * i, &h, 2);
      }
    }
    std::vector<unsigned char> out(pr.q.size(), 0xFF);
    std::vector<float> lse(fp8.lse.size(), NAN);
    std::vector<int64_t> ws(static_cast<size_t>(pr.S) + 1, -7);
    int32_t error = 0;
    const kk::prefill_params a{out.data(), pr.q.data(), plain_kv.data(), pr.indptr.data(), pr.table.data(),
                               pr.lens.data(), ws.data(), pr.S, pr.hq, pr.hkv, pr.d, pr.bs, pr.maxb, pr.nb, pr.scale,
                               pr.window_left, pr.cap, &error, lse.data(), 1.0F};
    kvpager_emulation::launch(dim3(1), dim3(kk::kPrefillPrepThreads), kk::prefill_prepare_kernel<>, a);
    const dim3 grid(3), block(kk::kPrefillWarps * 32);
    if (q_dtype == KVPAGER_DTYPE_FP32) kvpager_emulation::launch(grid, block, kk::prefill_simt_kernel<float>, a);
    else if (q_dtype == KVPAGER_DTYPE_FP16) kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<__half, 64>, a);
    else kvpager_emulation::launch(grid, block, kk::prefill_mma_kernel<__nv_bfloat16, 64>, a);
    EXPECT_EQ(fp8.error, 0);
    EXPECT_EQ(error, 0);
    EXPECT_EQ(fp8.out, out) << q_dtype;
    EXPECT_EQ(std::memcmp(fp8.lse.data(), lse.data(), lse.size() * sizeof(float)), 0) << q_dtype;
    EXPECT_LE(pr.compare(out), tolerance(q_dtype)) << q_dtype;  // and both are right
  }
}

// The host checks of kvpager_cuda_paged_attention_prefill_fp8 in their documented order, before anything is launched.
TEST(CudaPrefillFp8Emulation, HostChecksRefuseBeforeAnyLaunch) {
  prefill_problem pr(KVPAGER_DTYPE_FP16, 64, 16, 4, 2, -1, 0.0F, {{20, 20}}, 8, false);
  pr.use_fp8_kv(kKScale, kVScale);
  std::vector<unsigned char> out(pr.q.size(), 0xAB);
  std::vector<float> lse(static_cast<size_t>(pr.rows * pr.hq), 7.0F);
  std::vector<int64_t> ws(2, 0);
  int32_t error = 0;
  auto call = [&](int32_t hq, int32_t d, int32_t bs, int32_t maxb, float scale, int32_t window, float cap,
                  int32_t q_dtype, float ks, float vs, int32_t ctas, int64_t ws_bytes, const void* q = nullptr) {
    return emulated_prefill_fp8(out.data(), lse.data(), q ? q : pr.q.data(), pr.kv8.data(), pr.indptr.data(),
                                pr.table.data(), pr.lens.data(), pr.S, hq, 2, d, bs, maxb, pr.nb, scale, window, cap,
                                q_dtype, ks, vs, ctas, ws.data(), ws_bytes, &error);
  };
  const float s = pr.scale, k = kKScale, v = kVScale;
  const int32_t mb = pr.maxb;
  EXPECT_EQ(call(4, 64, 16, mb, s, -1, 0, 1, k, v, 0, 16), KVPAGER_STATUS_INVALID_ARGUMENT);  // no CTA
  EXPECT_EQ(call(4, 64, 16, 0, s, -1, 0, 1, k, v, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT);   // max_blocks 0
  for (float bad : {0.0F, -1.0F, NAN, INFINITY}) {
    EXPECT_EQ(call(4, 64, 16, mb, s, -1, 0, 1, bad, v, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(call(4, 64, 16, mb, s, -1, 0, 1, k, bad, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(call(3, 64, 16, mb, s, -1, 0, 1, bad, v, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT) << "scales before heads";
  }
  EXPECT_EQ(call(3, 64, 16, mb, s, -1, 0, 1, k, v, 1, 16), KVPAGER_STATUS_BAD_HEADS);
  EXPECT_EQ(call(4, 72, 16, mb, s, -1, 0, 3, k, v, 1, 16), KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM);  // geometry first
  EXPECT_EQ(call(4, 64, 12, mb, s, -1, 0, 3, k, v, 1, 16), KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE);
  EXPECT_EQ(call(4, 64, 16, mb, s, -1, 0, 3, k, v, 1, 16), KVPAGER_STATUS_UNSUPPORTED_DTYPE);  // an fp8 query
  EXPECT_EQ(call(4, 64, 16, mb, s, -2, 0, 3, k, v, 1, 16), KVPAGER_STATUS_UNSUPPORTED_DTYPE);  // q_dtype before window
  EXPECT_EQ(call(4, 64, 16, mb, s, -2, 0, 1, k, v, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT);   // window
  EXPECT_EQ(call(4, 64, 16, mb, s, -1, -1.0F, 1, k, v, 1, 16), KVPAGER_STATUS_INVALID_ARGUMENT);  // cap
  EXPECT_EQ(call(4, 64, 16, mb, s, -1, 0, 1, k, v, 1, 15), KVPAGER_STATUS_INVALID_ARGUMENT);      // workspace
  EXPECT_EQ(emulated_prefill_fp8(out.data(), nullptr, pr.q.data(), nullptr, pr.indptr.data(), pr.table.data(),
                                 pr.lens.data(), pr.S, 4, 2, 64, 16, mb, pr.nb, s, -1, 0, 1, k, v, 1, ws.data(), 16,
                                 &error),
            KVPAGER_STATUS_INVALID_ARGUMENT);  // no pool
  EXPECT_EQ(error, 0);
  for (unsigned char b : out) ASSERT_EQ(b, 0xAB) << "a refused call wrote its output";
  for (float x : lse) ASSERT_EQ(x, 7.0F) << "a refused call wrote its LSE";
  EXPECT_EQ(emulated_prefill_fp8(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 4, 2, 64, 16, 1, 1,
                                 s, -1, 0, 1, k, v, 1, nullptr, 0, nullptr),
            KVPAGER_STATUS_OK);  // nothing to do
}
