// The CUDA kernels (kernels/cuda/device_kernels.cuh) compiled as plain C++ over an emulation of the CUDA execution
// model (cuda_emulation.hpp) and run on CPU threads against the CPU backend, so their logic (indexing, split-KV,
// merge, LSE, bounds checks) is tested on every machine, GPU or not; under ASan/UBSan too. A GPU run
// (tests/kernels/cuda_test.cpp, .ci/gpu_check.sh) is still what checks the compiled kernels and their speed.
#include "cuda_emulation.hpp"

#include "../../kernels/cuda/device_kernels.cuh"
#include "../../tools/gpu_check/decode_problem.hpp"

#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

namespace {

using kvpager_gpu_check::decode_problem;
using kvpager_gpu_check::gpu_tolerance;
namespace kk = kvpager_cuda_kernels;

struct emulated {
  std::vector<unsigned char> out;
  std::vector<float> lse;
  int32_t error = 0;
};

template <class T, int D>
emulated run_dim(const decode_problem& pr, const std::vector<int32_t>& table) {
  emulated r;
  r.out.assign(pr.q.size(), 0xFF);  // NaN-ish garbage: every element must be written
  r.lse.assign(pr.cpu_lse.size(), 12345.0F);
  std::vector<float> part(pr.splits > 1 ? static_cast<size_t>(pr.S) * pr.hq * pr.splits * (D + 2) : 0);
  auto* out = reinterpret_cast<T*>(r.out.data());
  kvpager_emulation::launch(dim3(static_cast<unsigned>(pr.S), static_cast<unsigned>(pr.hkv), static_cast<unsigned>(pr.splits)),
                            dim3(kk::kWarps * 32), kk::decode_kernel<T, D>, out, r.lse.data(), part.data(),
                            reinterpret_cast<const T*>(pr.q.data()), reinterpret_cast<const T*>(pr.kv.data()), table.data(),
                            pr.lens.data(), pr.hq, pr.hkv, pr.bs, pr.maxb, pr.nb, pr.scale, pr.splits, &r.error);
  if (pr.splits > 1)
    kvpager_emulation::launch(dim3(static_cast<unsigned>(pr.S), static_cast<unsigned>(pr.hq)), dim3(128), kk::merge_kernel<T>,
                              out, r.lse.data(), static_cast<const float*>(part.data()), D, pr.splits);
  return r;
}

template <class T>
emulated run_type(const decode_problem& pr, const std::vector<int32_t>& table) {
  switch (pr.d) {
    case 64: return run_dim<T, 64>(pr, table);
    case 80: return run_dim<T, 80>(pr, table);
    case 96: return run_dim<T, 96>(pr, table);
    case 112: return run_dim<T, 112>(pr, table);
    case 128: return run_dim<T, 128>(pr, table);
    default: return run_dim<T, 256>(pr, table);
  }
}

emulated run(const decode_problem& pr, const std::vector<int32_t>& table) {
  switch (pr.dtype) {
    case KVPAGER_DTYPE_FP32: return run_type<float>(pr, table);
    case KVPAGER_DTYPE_FP16: return run_type<__half>(pr, table);
    default: return run_type<__nv_bfloat16>(pr, table);
  }
}

}  // namespace

TEST(CudaEmulation, DecodeMatchesCpuBackend) {
  // Query-head groups 4, 7, 12 (tiles of 8 + 4, or 4 + 4 + 4 at head_dim 256) and 1; one and three splits.
  const std::pair<int32_t, int32_t> heads[] = {{8, 2}, {7, 1}, {24, 2}, {4, 4}};
  const int32_t block_sizes[] = {8, 16, 32};
  uint32_t seed = 1;
  for (int32_t dtype : {KVPAGER_DTYPE_FP32, KVPAGER_DTYPE_FP16, KVPAGER_DTYPE_BF16})
    for (int32_t d : {64, 80, 96, 112, 128, 256}) {
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
  kvpager_emulation::launch(dim3(3, 1), dim3(256), kk::copy_kernel, static_cast<void* const*>(layers.data()), pairs.data(), nb,
                            static_cast<int64_t>(block_elems * 2), &error);
  EXPECT_EQ(error, 0);
  EXPECT_EQ(emu, cpu);
  const std::vector<int64_t> bad_pairs = {1, nb};
  kvpager_emulation::launch(dim3(1, 1), dim3(256), kk::copy_kernel, static_cast<void* const*>(layers.data()), bad_pairs.data(),
                            nb, static_cast<int64_t>(block_elems * 2), &error);
  EXPECT_EQ(error, KVPAGER_STATUS_INVALID_BLOCK);
  EXPECT_EQ(emu, cpu);
}
