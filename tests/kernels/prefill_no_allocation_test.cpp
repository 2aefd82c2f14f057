// SPDX-License-Identifier: Apache-2.0
// The CPU prefill allocates nothing per call once the calling thread's buffers have grown (first call): the tiled
// kernel (item scratch, the per-sequence item offsets) and the decode shortcut of a one-row-per-sequence batch (its
// split workspace), over fp32 and fp8 E4M3 pools. This executable replaces the global operator new and counts every allocation.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/float8.hpp>
#include <kvpager/kernels/prefill.hpp>

#include <gtest/gtest.h>

#include "kvpager_testing/allocation_probe.hpp"

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

using namespace kvpager;

namespace {

/// One layer's fp32 pool and tables: `seqs` sequences of `len` tokens, each with `q_len` query rows.
struct problem {
  std::int32_t hq, hkv, d = 64, bs = 16, len, q_len, seqs, max_blocks, num_blocks;
  std::vector<float> kv, q, out;
  std::vector<std::int32_t> table, lens, qo;
  problem(std::int32_t hq_, std::int32_t hkv_, std::int32_t seqs_, std::int32_t len_, std::int32_t q_len_)
      : hq(hq_), hkv(hkv_), len(len_), q_len(q_len_), seqs(seqs_) {
    max_blocks = (len + bs - 1) / bs;
    num_blocks = seqs * max_blocks;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
    kv.resize(static_cast<std::size_t>(num_blocks) * 2 * static_cast<std::size_t>(hkv * bs * d));
    for (float& x : kv) x = uni(rng);
    q.resize(static_cast<std::size_t>(seqs * q_len * hq * d));
    for (float& x : q) x = uni(rng);
    out.resize(q.size());
    table.resize(static_cast<std::size_t>(num_blocks));
    std::iota(table.begin(), table.end(), 0);
    lens.assign(static_cast<std::size_t>(seqs), len);
    for (std::int32_t s = 0; s <= seqs; ++s) qo.push_back(s * q_len);
  }
  prefill_params params(std::int32_t window) {
    prefill_params p;
    p.out = out.data();
    p.query = q.data();
    p.kv = paged_kv_view::hnd(kv.data(), KVPAGER_DTYPE_FP32, num_blocks, hkv, bs, d);
    p.pages.block_table = table.data();
    p.pages.row_stride = max_blocks;
    p.pages.seq_lens = lens.data();
    p.qo_indptr = qo.data();
    p.num_seqs = seqs;
    p.num_q_heads = hq;
    p.scale = 0.125F;
    p.window_left = window;
    p.logits_soft_cap = window >= 0 ? 20.0F : 0.0F;
    p.num_threads = 1;
    return p;
  }
};

std::int64_t allocations_of_five_calls(const prefill_params& p) {
  EXPECT_TRUE(paged_attention_prefill_cpu(p).ok());  // first call: the thread's buffers grow
  const std::int64_t before = probe::allocations.load();
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(paged_attention_prefill_cpu(p).ok());
  return probe::allocations.load() - before;
}

}  // namespace

TEST(CpuPrefillAllocation, TiledPrefillAllocatesNothingInSteadyState) {
  problem pr(8, 2, 3, 300, 120);
  EXPECT_EQ(allocations_of_five_calls(pr.params(-1)), 0);
  EXPECT_EQ(allocations_of_five_calls(pr.params(40)), 0) << "window and soft cap";
}

TEST(CpuPrefillAllocation, DecodeShortcutWithSplitsAllocatesNothingInSteadyState) {
  problem pr(4, 1, 1, 2048, 1);  // one (sequence, KV head) item on one thread: the decode splits the KV
  EXPECT_GT(plan_decode(1, 1, 2048, 1), 1) << "this shape must take the split (workspace) path";
  EXPECT_EQ(allocations_of_five_calls(pr.params(-1)), 0);
}

TEST(CpuPrefillAllocation, Fp8PoolAllocatesNothingInSteadyState) {
  // The same problems over an fp8 E4M3 pool (fp32 query and output): the tiled kernel, and the fp8 decode shortcut
  // of a one-row batch with splits.
  for (const std::int32_t q_len : {120, 1}) {
    problem pr(q_len == 1 ? 4 : 8, q_len == 1 ? 1 : 2, q_len == 1 ? 1 : 3, q_len == 1 ? 2048 : 300, q_len);
    std::vector<std::uint8_t> kv8(pr.kv.size());  // one byte per element
    for (std::size_t i = 0; i < kv8.size(); ++i) kv8[i] = detail::float_to_e4m3(pr.kv[i] * 100.0F);
    for (const std::int32_t window : {-1, 40}) {
      prefill_params p = pr.params(window);
      p.kv = paged_kv_view::hnd(kv8.data(), KVPAGER_DTYPE_FP8_E4M3, pr.num_blocks, pr.hkv, pr.bs, pr.d);
      p.q_dtype = KVPAGER_DTYPE_FP32;
      p.k_scale = 0.01F;
      p.v_scale = 0.01F;
      EXPECT_EQ(allocations_of_five_calls(p), 0) << "q_len " << q_len << " window " << window;
    }
  }
}

TEST(CpuPrefillAllocation, TheCounterSeesTheBuffersGrow) {
  problem small(4, 1, 2, 64, 2);
  EXPECT_TRUE(paged_attention_prefill_cpu(small.params(-1)).ok());
  // More sequences than any call of this thread so far: its per-sequence item offsets grow, once.
  problem bigger(4, 1, 4000, 16, 2);
  const std::int64_t before = probe::allocations.load();
  EXPECT_TRUE(paged_attention_prefill_cpu(bigger.params(-1)).ok());
  EXPECT_GT(probe::allocations.load() - before, 0);
}
