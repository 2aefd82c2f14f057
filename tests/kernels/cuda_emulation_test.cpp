// SPDX-License-Identifier: Apache-2.0
// The CUDA kernels (kernels/cuda/device_kernels.cuh) compiled as plain C++ over an emulation of the CUDA execution
// model (cuda_emulation.hpp) and run on CPU threads against the CPU backend, so their logic (indexing, split-KV,
// merge, LSE, bounds checks) is tested on every machine, GPU or not; under ASan/UBSan too. A GPU run
// (tests/kernels/cuda_test.cpp, .ci/gpu_check.sh) is still what checks the compiled kernels and their speed.
#include "cuda_emulation.hpp"

#include "kernels/cuda/device_kernels.cuh"
#include "kernels/cuda/device_fp8.cuh"
#include "fp8_problem.hpp"

#include <cuda_fp8.h>
#include "kvpager_testing/decode_problem.hpp"
#include "kernels/common/checks.hpp"
#include "abi_cases.hpp"

#include <gtest/gtest.h>

#include <iterator>
#include <random>
#include <utility>
#include <vector>

namespace {

using kvpager_gpu_check::decode_problem;
using kvpager_gpu_check::gpu_tolerance;
namespace kk = kvpager::kernels::detail;

struct emulated {
  std::vector<unsigned char> out;
  std::vector<float> lse;
  int32_t error = 0;
};

/// Grid rows (y) of the decode and merge kernels: the head counts, or at most `rows` when it is not 0 (the kernels
/// then walk the remaining heads themselves, as they do beyond CUDA's 65535).
unsigned grid_rows(int32_t heads, unsigned rows) {
  return rows != 0 && rows < static_cast<unsigned>(heads) ? rows : static_cast<unsigned>(heads);
}

template <class T, int D>
emulated run_dim(const decode_problem& pr, const std::vector<int32_t>& table, unsigned rows) {
  emulated r;
  r.out.assign(pr.q.size(), 0xFF);  // NaN-ish garbage: every element must be written
  r.lse.assign(pr.cpu_lse.size(), 12345.0F);
  std::vector<float> part(pr.splits > 1 ? static_cast<size_t>(pr.S) * pr.hq * pr.splits * (D + 2) : 0);
  auto* out = reinterpret_cast<T*>(r.out.data());
  kvpager_emulation::launch(dim3(static_cast<unsigned>(pr.S), grid_rows(pr.hkv, rows), static_cast<unsigned>(pr.splits)),
                            dim3(kk::kWarps * 32), kk::decode_kernel<T, D>, out, r.lse.data(), part.data(),
                            reinterpret_cast<const T*>(pr.q.data()), reinterpret_cast<const T*>(pr.kv.data()), table.data(),
                            pr.lens.data(), pr.hq, pr.hkv, pr.bs, pr.maxb, pr.nb, pr.scale, pr.window_left,
                            pr.logits_soft_cap, pr.splits, &r.error);
  if (pr.splits > 1)
    kvpager_emulation::launch(dim3(static_cast<unsigned>(pr.S), grid_rows(pr.hq, rows)), dim3(128), kk::merge_kernel<T>,
                              out, r.lse.data(), static_cast<const float*>(part.data()), pr.hq, D, pr.splits);
  return r;
}

template <class T>
emulated run_type(const decode_problem& pr, const std::vector<int32_t>& table, unsigned rows) {
  switch (pr.d) {
    case 64: return run_dim<T, 64>(pr, table, rows);
    case 80: return run_dim<T, 80>(pr, table, rows);
    case 96: return run_dim<T, 96>(pr, table, rows);
    case 112: return run_dim<T, 112>(pr, table, rows);
    case 128: return run_dim<T, 128>(pr, table, rows);
    default: return run_dim<T, 256>(pr, table, rows);
  }
}

emulated run(const decode_problem& pr, const std::vector<int32_t>& table, unsigned rows = 0) {
  switch (pr.dtype) {
    case KVPAGER_DTYPE_FP32: return run_type<float>(pr, table, rows);
    case KVPAGER_DTYPE_FP16: return run_type<__half>(pr, table, rows);
    default: return run_type<__nv_bfloat16>(pr, table, rows);
  }
}

// The CUDA entry points as kernels.cu writes them: the shared host checks (kernels/common/checks.hpp), then the
// device code, here on the emulation; a status the kernel flags is returned as the call's. fp32 and head dim 64 only
// (every other valid geometry is the same code path; invalid ones never reach a kernel).
int32_t emulated_decode(void* out, const void* q, const void* kv, const int32_t* table, const int32_t* lens,
                        int32_t num_seqs, int32_t hq, int32_t hkv, int32_t d, int32_t bs, int32_t maxb, int32_t nb,
                        float scale, int32_t dtype) {
  if (const int32_t rc = kvpager::kernels::detail::check_dense_decode(out, q, kv, table, lens, num_seqs, hq, hkv, d, bs, maxb, nb,
                                                             scale, dtype, dtype, 1.0F, 1.0F, 1);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_seqs == 0) return KVPAGER_STATUS_OK;
  EXPECT_TRUE(dtype == KVPAGER_DTYPE_FP32 && d == 64) << "emulated_decode runs fp32, head dim 64 only";
  int32_t error = 0;
  kvpager_emulation::launch(dim3(static_cast<unsigned>(num_seqs), static_cast<unsigned>(hkv), 1), dim3(kk::kWarps * 32),
                            kk::decode_kernel<float, 64>, static_cast<float*>(out), static_cast<float*>(nullptr),
                            static_cast<float*>(nullptr), static_cast<const float*>(q), static_cast<const float*>(kv), table,
                            lens, hq, hkv, bs, maxb, nb, scale, -1, 0.0F, 1, &error);
  return error;
}

int32_t emulated_append(void* kv, const void* k, const void* v, const int64_t* slots, int32_t num_tokens, int32_t hkv,
                        int32_t d, int32_t bs, int32_t nb, int32_t dtype) {
  if (const int32_t rc = kvpager::kernels::detail::check_append(kv, k, v, slots, num_tokens, hkv, d, bs, nb, dtype, dtype,
                                                                    1.0F, 1.0F);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_tokens == 0) return KVPAGER_STATUS_OK;
  EXPECT_EQ(dtype, KVPAGER_DTYPE_FP32) << "emulated_append runs fp32 only";
  int32_t error = 0;
  kvpager_emulation::launch(dim3(static_cast<unsigned>(num_tokens)), dim3(256), kk::append_kernel<float>,
                            static_cast<float*>(kv), static_cast<const float*>(k), static_cast<const float*>(v), slots, hkv,
                            d, bs, int64_t{nb} * bs, &error);
  return error;
}

int32_t emulated_copy(void* const* caches, int32_t num_layers, const int64_t* mapping, int32_t num_pairs, int32_t nb,
                      int64_t block_bytes) {
  if (const int32_t rc = kvpager::kernels::detail::check_copy(caches, num_layers, mapping, num_pairs, nb, block_bytes,
                                                     kvpager::kernels::detail::memory::device);
      rc != KVPAGER_STATUS_OK)
    return rc;
  if (num_pairs == 0) return KVPAGER_STATUS_OK;
  int32_t error = 0;
  kvpager_emulation::launch(dim3(static_cast<unsigned>(num_pairs), grid_rows(num_layers > 0 ? num_layers : 1, 65535)),
                            dim3(256), kk::copy_kernel, caches, num_layers, mapping, nb, block_bytes, &error);
  return error;
}

const kvpager_abi_cases::kernels_api emulated_api{"cuda (emulated)", emulated_decode, emulated_append, emulated_copy,
                                                  nullptr, false};

}  // namespace

TEST(CudaEmulation, DecodeMatchesCpuBackend) {
  // Query-head groups 4, 7, 12 (tiles of 8 + 4, or 4 + 4 + 4 at head_dim 256) and 1; one and three splits.
  const std::pair<int32_t, int32_t> heads[] = {{8, 2}, {7, 1}, {24, 2}, {4, 4}};
  const int32_t block_sizes[] = {8, 16, 32};
  uint32_t seed = 1;
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 96, 112, 128, 256}) {
#if defined(KVPAGER_TEST_REDUCED)
      if (seed % 3 != 1) {  // sanitizer and no-exception builds: a third of the matrix, every dtype (default: all)
        ++seed;
        continue;
      }
#endif
      const auto [hq, hkv] = heads[seed % 4];
      const int32_t bs = block_sizes[seed % 3];
      const int32_t splits = seed % 2 == 0 ? 1 : 3;
      const decode_problem pr(dtype, d, bs, hq, hkv, {1, bs - 1, bs + 1, 97, 0}, splits, seed++);
      ASSERT_TRUE(pr.cpu_ok);
      const emulated r = run(pr, pr.table);
      const auto diff = pr.compare(r.out, r.lse);
      const auto what = ::testing::Message() << "dtype " << dtype << " d " << d << " bs " << bs << " hq " << hq << " hkv "
                                             << hkv << " splits " << splits;
      EXPECT_EQ(r.error, 0) << what;
      EXPECT_LE(diff.out, gpu_tolerance(dtype)) << what;
      EXPECT_LE(diff.lse, 1e-5) << what;
    }
}

TEST(CudaEmulation, WindowAndSoftCapMatchCpuBackend) {
  // Windows inside a block, across blocks, longer than the sequence and 0 (the query's own token only), with and
  // without a soft cap, one and several splits (the splits start at the window's first block).
  struct variant {
    int32_t window;
    float cap;
    int32_t splits;
  };
  const variant variants[] = {{-1, 5.0F, 1}, {0, 0.0F, 1}, {37, 0.0F, 3}, {100, 2.5F, 4}, {5, 30.0F, 2}, {1000, 1.0F, 3}};
  // Every variant with two dtypes of the three (the window and the cap do not depend on the dtype; the loads do).
  uint32_t seed = 300;
  const int32_t dtypes[] = {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16};
  for (size_t di = 0; di < 3; ++di) {
    const int32_t dtype = dtypes[di];
    for (size_t vi = 0; vi < std::size(variants); ++vi) {
      const variant& v = variants[vi];
      if ((di + vi) % 3 == 0) continue;
#if defined(KVPAGER_TEST_REDUCED)
      if (seed % 3 == 0) {  // sanitizer and no-exception builds: fewer still, every dtype
        ++seed;
        continue;
      }
#endif
      const int32_t d = seed % 2 == 0 ? 128 : 64, bs = seed % 3 == 0 ? 8 : 16;
      decode_problem pr(dtype, d, bs, 8, 2, {1, 97, 170, 0}, v.splits, seed++, v.window, v.cap);
      ASSERT_TRUE(pr.cpu_ok);
      const emulated r = run(pr, pr.table);
      const auto diff = pr.compare(r.out, r.lse);
      const auto what = ::testing::Message() << "dtype " << dtype << " d " << d << " bs " << bs << " window " << v.window
                                             << " cap " << v.cap << " splits " << v.splits;
      EXPECT_EQ(r.error, 0) << what;
      EXPECT_LE(diff.out, gpu_tolerance(dtype)) << what;
      EXPECT_LE(diff.lse, 1e-5) << what;
    }
  }
}

TEST(CudaEmulation, LongSequenceManySplits) {
  const decode_problem pr(KVPAGER_DTYPE_FP32, 64, 16, 8, 1, {700, 33}, 9, 77);
  const emulated r = run(pr, pr.table);
  const auto diff = pr.compare(r.out, r.lse);
  EXPECT_EQ(r.error, 0);
  EXPECT_LE(diff.out, 1e-5);
  EXPECT_LE(diff.lse, 1e-5);
}

TEST(CudaEmulation, BadBlockIdIsFlaggedAndNeverRead) {
  // The pool holds exactly nb blocks: with ASan, a read of block nb (or of a negative one) would be reported.
  const decode_problem pr(KVPAGER_DTYPE_FP32, 64, 16, 4, 2, {40, 20}, 1, 5);
  for (int32_t bad : {pr.nb, -1}) {
    auto table = pr.table;
    table[1] = bad;  // second block of the first sequence
    const emulated r = run(pr, table);
    EXPECT_EQ(r.error, KVPAGER_STATUS_INVALID_BLOCK) << bad;
    // The second sequence does not use the bad entry: its output still matches.
    const auto diff = pr.compare(r.out, {});
    for (size_t i = pr.q.size() / pr.esz() / 2; i < pr.q.size() / pr.esz(); ++i)
      EXPECT_NEAR(pr.value(r.out, i), pr.value(pr.cpu_out, i), 1e-5) << i;
    EXPECT_GT(diff.out, 0.0) << "the first sequence lost a block's tokens";
  }
}

TEST(CudaEmulation, SequenceTooLongIsFlagged) {
  const decode_problem pr(KVPAGER_DTYPE_FP32, 64, 16, 4, 2, {40}, 1, 6);
  decode_problem too_long(pr);
  too_long.lens[0] = too_long.maxb * too_long.bs + 1;
  const emulated r = run(too_long, too_long.table);
  EXPECT_EQ(r.error, KVPAGER_STATUS_SEQ_TOO_LONG);
  for (size_t i = 0; i < pr.q.size() / pr.esz(); ++i) EXPECT_EQ(pr.value(r.out, i), 0.0) << "a rejected sequence reads as empty";
}

TEST(CudaEmulation, AppendAndCopyAreBitExact) {
  const int32_t hkv = 2, d = 64, bs = 16, nb = 8, tokens = 5;
  const size_t block_elems = 2ULL * hkv * bs * d;
  std::mt19937 rng(9);
  std::vector<uint16_t> cache(nb * block_elems), k(tokens * hkv * d), v(k.size());
  for (auto& x : cache) x = static_cast<uint16_t>(rng());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint16_t>(rng());
    v[i] = static_cast<uint16_t>(rng());
  }
  const std::vector<int64_t> slots = {5 * bs + 3, -1, 2 * bs, 7 * bs + 15, 0};
  auto cpu = cache, emu = cache;
  ASSERT_EQ(kvpager_cpu_kv_append(cpu.data(), k.data(), v.data(), slots.data(), tokens, hkv, d, bs, nb, KVPAGER_DTYPE_FP16), 0);
  int32_t error = 0;
  kvpager_emulation::launch(dim3(tokens), dim3(256), kk::append_kernel<__half>, reinterpret_cast<__half*>(emu.data()),
                            reinterpret_cast<const __half*>(k.data()), reinterpret_cast<const __half*>(v.data()),
                            slots.data(), hkv, d, bs, int64_t{nb} * bs, &error);
  EXPECT_EQ(error, 0);
  EXPECT_EQ(emu, cpu);
  const std::vector<int64_t> bad_slots = {int64_t{nb} * bs};
  kvpager_emulation::launch(dim3(1), dim3(256), kk::append_kernel<__half>, reinterpret_cast<__half*>(emu.data()),
                            reinterpret_cast<const __half*>(k.data()), reinterpret_cast<const __half*>(v.data()),
                            bad_slots.data(), hkv, d, bs, int64_t{nb} * bs, &error);
  EXPECT_EQ(error, KVPAGER_STATUS_INVALID_BLOCK);
  EXPECT_EQ(emu, cpu);

  const std::vector<int64_t> pairs = {5, 1, 2, 3, 7, 6};
  void* cpu_ptr = cpu.data();
  ASSERT_EQ(kvpager_cpu_copy_blocks(&cpu_ptr, 1, pairs.data(), 3, nb, static_cast<int64_t>(block_elems * 2)), 0);
  std::vector<void*> layers = {emu.data()};
  error = 0;
  kvpager_emulation::launch(dim3(3, 1), dim3(256), kk::copy_kernel, static_cast<void* const*>(layers.data()), 1, pairs.data(), nb,
                            static_cast<int64_t>(block_elems * 2), &error);
  EXPECT_EQ(error, 0);
  EXPECT_EQ(emu, cpu);
  const std::vector<int64_t> bad_pairs = {1, nb};
  kvpager_emulation::launch(dim3(1, 1), dim3(256), kk::copy_kernel, static_cast<void* const*>(layers.data()), 1, bad_pairs.data(),
                            nb, static_cast<int64_t>(block_elems * 2), &error);
  EXPECT_EQ(error, KVPAGER_STATUS_INVALID_BLOCK);
  EXPECT_EQ(emu, cpu);
}

// The argument cases of the CPU entry points (abi_cases.hpp, buffers behind guard pages) through the CUDA host checks
// and the emulated device code: the same status code for every case (issue 9, item 3: one rule for CPU and CUDA).
TEST(CudaEmulation, DecodeArgumentCasesMatchCpu) { kvpager_abi_cases::decode_cases(emulated_api); }
TEST(CudaEmulation, AppendArgumentCasesMatchCpu) { kvpager_abi_cases::append_cases(emulated_api); }
TEST(CudaEmulation, CopyBlocksArgumentCasesMatchCpu) { kvpager_abi_cases::copy_cases(emulated_api); }

// More KV or query heads than grid rows (CUDA allows 65535): the CTAs walk the rest, with the same result.
TEST(CudaEmulation, DecodeWalksHeadsBeyondTheGridRows) {
  for (const int32_t splits : {1, 3}) {
    const decode_problem pr(KVPAGER_DTYPE_FP32, 64, 16, 12, 4, {100, 33, 0}, splits, 31);
    ASSERT_TRUE(pr.cpu_ok);
    for (const unsigned rows : {1U, 3U}) {
      const emulated r = run(pr, pr.table, rows);
      const auto diff = pr.compare(r.out, r.lse);
      EXPECT_EQ(r.error, 0) << rows;
      EXPECT_LE(diff.out, 1e-5) << "splits " << splits << " rows " << rows;
      EXPECT_LE(diff.lse, 1e-5) << "splits " << splits << " rows " << rows;
    }
  }
}

// Layers beyond the grid's rows, and a pair onto itself: copied (or left) exactly as the CPU does.
TEST(CudaEmulation, CopyWalksLayersBeyondTheGridRowsAndSkipsPairsOntoThemselves) {
  const int64_t bb = 64;
  const int32_t nb = 4, layers = 5;
  std::vector<std::vector<unsigned char>> cpu(layers), emu(layers);
  std::vector<void*> cpu_ptrs, emu_ptrs;
  for (int32_t l = 0; l < layers; ++l) {
    cpu[static_cast<size_t>(l)].resize(static_cast<size_t>(nb * bb));
    for (size_t i = 0; i < cpu[static_cast<size_t>(l)].size(); ++i)
      cpu[static_cast<size_t>(l)][i] = static_cast<unsigned char>(i * 7 + static_cast<size_t>(l));
    emu[static_cast<size_t>(l)] = cpu[static_cast<size_t>(l)];
    cpu_ptrs.push_back(cpu[static_cast<size_t>(l)].data());
    emu_ptrs.push_back(emu[static_cast<size_t>(l)].data());
  }
  const std::vector<int64_t> pairs = {0, 3, 2, 2, 1, 0};
  ASSERT_EQ(kvpager_cpu_copy_blocks(cpu_ptrs.data(), layers, pairs.data(), 3, nb, bb), KVPAGER_STATUS_OK);
  int32_t error = 0;
  kvpager_emulation::launch(dim3(3, 2), dim3(64), kk::copy_kernel, static_cast<void* const*>(emu_ptrs.data()), layers,
                            pairs.data(), nb, bb, &error);
  EXPECT_EQ(error, 0);
  EXPECT_EQ(emu, cpu);
}

// ------------------------------------------------------------------------------------------- fp8 E4M3 pools
namespace {

/// decode_fp8_kernel (and merge_kernel for several splits) on the emulation, as kernels.cu launches them.
template <class T, int D>
emulated run_fp8_dim(const kvpager_fp8_test::fp8_problem& pr, int32_t splits, int32_t window_left, float cap) {
  emulated r;
  r.out.assign(pr.out_bytes(), 0xFF);
  r.lse.assign(static_cast<size_t>(pr.S * pr.hq), 12345.0F);
  std::vector<float> part(splits > 1 ? static_cast<size_t>(pr.S) * pr.hq * splits * (D + 2) : 0);
  auto* out = reinterpret_cast<T*>(r.out.data());
  kvpager_emulation::launch(dim3(static_cast<unsigned>(pr.S), static_cast<unsigned>(pr.hkv), static_cast<unsigned>(splits)),
                            dim3(kk::kWarps * 32), kk::decode_fp8_kernel<T, D>, out, r.lse.data(), part.data(),
                            reinterpret_cast<const T*>(pr.q.data()), static_cast<const uint8_t*>(pr.kv.data()),
                            pr.table.data(), pr.lens.data(), pr.hq, pr.hkv, pr.bs, pr.maxb, pr.nb, pr.scale * pr.k_scale,
                            pr.v_scale, window_left, cap, splits, &r.error);
  if (splits > 1)
    kvpager_emulation::launch(dim3(static_cast<unsigned>(pr.S), static_cast<unsigned>(pr.hq)), dim3(128),
                              kk::merge_kernel<T>, out, r.lse.data(), static_cast<const float*>(part.data()), pr.hq, D,
                              splits);
  return r;
}
template <class T>
emulated run_fp8_type(const kvpager_fp8_test::fp8_problem& pr, int32_t splits, int32_t window_left, float cap) {
  switch (pr.d) {
    case 64: return run_fp8_dim<T, 64>(pr, splits, window_left, cap);
    case 80: return run_fp8_dim<T, 80>(pr, splits, window_left, cap);
    case 96: return run_fp8_dim<T, 96>(pr, splits, window_left, cap);
    case 112: return run_fp8_dim<T, 112>(pr, splits, window_left, cap);
    case 128: return run_fp8_dim<T, 128>(pr, splits, window_left, cap);
    default: return run_fp8_dim<T, 256>(pr, splits, window_left, cap);
  }
}
emulated run_fp8(const kvpager_fp8_test::fp8_problem& pr, int32_t splits, int32_t window_left = -1, float cap = 0.0F) {
  switch (pr.q_dtype) {
    case KVPAGER_DTYPE_FP32: return run_fp8_type<float>(pr, splits, window_left, cap);
    case KVPAGER_DTYPE_FP16: return run_fp8_type<__half>(pr, splits, window_left, cap);
    default: return run_fp8_type<__nv_bfloat16>(pr, splits, window_left, cap);
  }
}

/// The CPU fp8 backend's output and LSE for the same problem, split count, window and cap.
emulated cpu_fp8(const kvpager_fp8_test::fp8_problem& pr, int32_t splits, int32_t window_left = -1, float cap = 0.0F) {
  emulated r;
  r.out.assign(pr.out_bytes(), 0);
  r.lse.assign(static_cast<size_t>(pr.S * pr.hq), 0.0F);
  kvpager::decode_params p;
  p.out = r.out.data();
  p.lse = r.lse.data();
  p.query = pr.q.data();
  p.kv = kvpager::paged_kv_view::hnd(pr.kv.data(), KVPAGER_DTYPE_FP8_E4M3, pr.nb, pr.hkv, pr.bs, pr.d);
  p.pages.block_table = pr.table.data();
  p.pages.row_stride = pr.maxb;
  p.pages.seq_lens = pr.lens.data();
  p.num_seqs = pr.S;
  p.num_q_heads = pr.hq;
  p.scale = pr.scale;
  p.num_splits = splits;
  p.q_dtype = pr.q_dtype;
  p.k_scale = pr.k_scale;
  p.v_scale = pr.v_scale;
  p.window_left = window_left;
  p.logits_soft_cap = cap;
  r.error = kvpager::paged_attention_decode_cpu(p).ok() ? 0 : -1;
  return r;
}

double max_diff(const kvpager_fp8_test::fp8_problem& pr, const std::vector<unsigned char>& a,
                const std::vector<unsigned char>& b) {
  double worst = 0;
  for (size_t i = 0; i < pr.out_elems(); ++i) {
    const double x = kvpager_fp8_test::get(a, pr.q_dtype, i), y = kvpager_fp8_test::get(b, pr.q_dtype, i);
    worst = std::isnan(x) || std::isnan(y) ? INFINITY : std::max(worst, std::abs(x - y));
  }
  return worst;
}

}  // namespace

TEST(CudaEmulation, Fp8DecodeMatchesCpuBackendAndReference) {
  // GQA 4, a group of 7 (tiles of 4 + 3), GQA 2, a group of 5; one and three splits. Kept small: every emulated
  // shuffle is a barrier of 32 threads.
  const std::pair<int32_t, int32_t> heads[] = {{8, 2}, {7, 1}, {4, 2}, {10, 2}};
  const int32_t block_sizes[] = {8, 16, 32};
  uint32_t seed = 1;
  for (int32_t q_dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 96, 112, 128, 256}) {
#if defined(KVPAGER_TEST_REDUCED)
      if (seed % 3 != 1) {  // sanitizer and no-exception builds: a third of the matrix, every q dtype
        ++seed;
        continue;
      }
#endif
      const auto [hq, hkv] = heads[seed % 4];
      const int32_t bs = block_sizes[seed % 3];
      const int32_t splits = seed % 2 == 0 ? 1 : 3;
      const kvpager_fp8_test::fp8_problem pr(q_dtype, d, bs, hq, hkv, {bs + 1, 45, 0}, seed++);
      const emulated gpu = run_fp8(pr, splits), cpu = cpu_fp8(pr, splits);
      const auto what = ::testing::Message() << "q dtype " << q_dtype << " d " << d << " bs " << bs << " hq " << hq
                                             << " hkv " << hkv << " splits " << splits;
      ASSERT_EQ(cpu.error, 0) << what;
      EXPECT_EQ(gpu.error, 0) << what;
      EXPECT_LE(max_diff(pr, gpu.out, cpu.out), gpu_tolerance(q_dtype)) << what;
      EXPECT_LE(pr.out_error(gpu.out), kvpager_fp8_test::tolerance(q_dtype)) << what;
      EXPECT_LE(pr.lse_error(gpu.lse), 1e-5) << what;
    }
}

TEST(CudaEmulation, Fp8DecodeWindowAndSoftCapMatchCpuBackend) {
  // The fp8 decode runs the plain decode's code over uint8_t rows: the window (blocks before it never read, splits
  // planned over it alone) and the soft cap hold for it as well; compared with the CPU fp8 backend given the same.
  struct cfg {
    int32_t q_dtype, d, bs, hq, hkv, window_left, splits;
    float cap;
  };
  const cfg cases[] = {{KVPAGER_DTYPE_FP16, 128, 16, 8, 2, 20, 1, 0.0F},  {KVPAGER_DTYPE_BF16, 64, 8, 4, 1, 0, 3, 30.0F},
                       {KVPAGER_DTYPE_FP32, 80, 32, 6, 3, 33, 3, 5.0F},   {KVPAGER_DTYPE_FP32, 256, 16, 4, 4, -1, 1, 0.25F},
                       {KVPAGER_DTYPE_BF16, 96, 16, 10, 2, 30, 1, 0.5F}};
  uint32_t seed = 40;
  for (const cfg& c : cases) {
    const kvpager_fp8_test::fp8_problem pr(c.q_dtype, c.d, c.bs, c.hq, c.hkv, {c.bs + 1, 45, 0, 70}, seed++);
    const emulated gpu = run_fp8(pr, c.splits, c.window_left, c.cap),
                   cpu = cpu_fp8(pr, c.splits, c.window_left, c.cap);
    const emulated plain = cpu_fp8(pr, c.splits);
    const auto what = ::testing::Message() << "q dtype " << c.q_dtype << " d " << c.d << " window " << c.window_left
                                           << " cap " << c.cap << " splits " << c.splits;
    ASSERT_EQ(cpu.error, 0) << what;
    EXPECT_EQ(gpu.error, 0) << what;
    EXPECT_LE(max_diff(pr, gpu.out, cpu.out), gpu_tolerance(c.q_dtype)) << what;
    // The window or the cap changed the result (the comparison above is not of two uncapped runs).
    EXPECT_GT(max_diff(pr, cpu.out, plain.out), 10 * gpu_tolerance(c.q_dtype)) << what;
  }
}

TEST(CudaEmulation, Fp8DecodeFlagsBadBlocksAndNeverReadsThem) {
  kvpager_fp8_test::fp8_problem pr(KVPAGER_DTYPE_FP32, 64, 16, 4, 2, {40, 20}, 5);
  pr.table[1] = pr.nb;  // second block of the first sequence: outside the pool (ASan would see a read)
  const emulated r = run_fp8(pr, 1);
  EXPECT_EQ(r.error, KVPAGER_STATUS_INVALID_BLOCK);
  // The second sequence does not use the bad entry: it still matches the reference.
  for (size_t i = pr.out_elems() / 2; i < pr.out_elems(); ++i)
    EXPECT_NEAR(kvpager_fp8_test::get(r.out, pr.q_dtype, i), pr.ref_out[i], 1e-5) << i;
}

TEST(CudaEmulation, Fp8AppendIsBitExactWithCpu) {
  const int32_t hkv = 2, d = 80, bs = 8, nb = 6, tokens = 5;
  const std::vector<int64_t> slots = {5 * bs + 3, -1, 2 * bs, 0, 4 * bs + 7};
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> uni(-3.0F, 3.0F);
  for (int32_t src : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16}) {
    std::vector<unsigned char> k(static_cast<size_t>(tokens * hkv * d) * kvpager_fp8_test::q_elem_bytes(src)), v(k.size());
    for (size_t i = 0; i < static_cast<size_t>(tokens * hkv * d); ++i) {
      kvpager_fp8_test::set(k, src, i, uni(rng));
      kvpager_fp8_test::set(v, src, i, uni(rng));
    }
    std::vector<uint8_t> cpu(static_cast<size_t>(nb * 2 * hkv * bs * d));
    for (auto& b : cpu) b = static_cast<uint8_t>(rng());
    auto emu = cpu;
    const float ks = 0.01F, vs = 0.0071F;
    ASSERT_EQ(kvpager_cpu_kv_append_fp8(cpu.data(), k.data(), v.data(), slots.data(), tokens, hkv, d, bs, nb, src, ks, vs), 0);
    int32_t error = 0;
    auto launch = [&](auto tag, const std::vector<int64_t>& sl) {
      using T = decltype(tag);
      kvpager_emulation::launch(dim3(static_cast<unsigned>(sl.size())), dim3(256), kk::append_fp8_kernel<T>, emu.data(),
                                reinterpret_cast<const T*>(k.data()), reinterpret_cast<const T*>(v.data()), sl.data(), hkv,
                                d, bs, int64_t{nb} * bs, ks, vs, &error);
    };
    auto run_src = [&](const std::vector<int64_t>& sl) {
      if (src == KVPAGER_DTYPE_FP32) launch(float{}, sl);
      else if (src == KVPAGER_DTYPE_FP16) launch(__half{}, sl);
      else launch(__nv_bfloat16{}, sl);
    };
    run_src(slots);
    EXPECT_EQ(error, 0);
    EXPECT_EQ(emu, cpu) << "src dtype " << src;
    run_src({int64_t{nb} * bs});
    EXPECT_EQ(error, KVPAGER_STATUS_INVALID_BLOCK);
    EXPECT_EQ(emu, cpu) << "a slot beyond the pool writes nothing";
  }
}

// kvpager/kernels/float8.hpp against NVIDIA's own conversions (cuda_fp8.h, host implementation): the same e4m3 code
// for every float tried (saturating, as vLLM's fp8 KV cache converts), the same value for every code.
TEST(CudaEmulation, Float8MatchesCudaFp8Header) {
  for (int c = 0; c < 256; ++c) {
    const __half_raw hr = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), __NV_E4M3);
    const float nv = __half2float(__half(hr));
    const float ours = kvpager::detail::e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(nv)) EXPECT_TRUE(std::isnan(ours)) << c;
    else EXPECT_EQ(ours, nv) << c;
  }
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> e(-12.0F, 10.0F);
  for (int i = 0; i < 50000; ++i) {
    const float x = std::exp2(e(rng)) * (i % 2 == 0 ? 1.0F : -1.0F);
    ASSERT_EQ(kvpager::detail::float_to_e4m3(x), __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)) << x;
  }
  for (const float x : {0.0F, -0.0F, 448.0F, 464.0F, 1e9F, -1e9F, INFINITY, -INFINITY})
    EXPECT_EQ(kvpager::detail::float_to_e4m3(x), __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)) << x;
}
