// SPDX-License-Identifier: Apache-2.0
// Prefix caching end to end, on the CPU kernels: a prompt admitted through a vllm_v1_cache with a prefix hit (an
// earlier request with the same prefix finished its prefill first) writes only its missed tokens' KV through the
// cache's slot mapping (kv_append), runs prefill over the block table the cache exports, and gets, row for row, the
// output of a prefill of the whole prompt in a fresh pool with no cache.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/float16.hpp>
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

using namespace kvpager;

namespace {

constexpr std::int32_t kBs = 16, kHq = 8, kHkv = 2, kD = 64, kBlocks = 40;

/// A token's K (kv = 0) or V (kv = 1) for one head and dim: a function of the token id and its position only, so
/// the shared prefix of two prompts has the same KV (as a model's would).
float kv_value(token_id tok, std::int32_t pos, std::int32_t kv, std::int32_t h, std::int32_t d) {
  std::uint32_t x = static_cast<std::uint32_t>(tok) * 2654435761U ^ static_cast<std::uint32_t>(pos) * 40503U ^
                    static_cast<std::uint32_t>(((kv * kHkv + h) * kD + d)) * 97U;
  x ^= x >> 15;
  x *= 2246822519U;
  x ^= x >> 13;
  return static_cast<float>(x % 20001U) / 10000.0F - 1.0F;
}
float q_value(token_id tok, std::int32_t pos, std::int32_t h, std::int32_t d) { return kv_value(tok + 7, pos, 0, h % kHkv, d) * (1.0F + 0.1F * static_cast<float>(h)); }

/// Elements of `dtype` (fp32 or bf16) as raw storage.
struct buffer {
  std::int32_t dtype;
  std::vector<std::uint32_t> f32;
  std::vector<std::uint16_t> b16;
  buffer(std::int32_t dt, std::size_t n) : dtype(dt) {
    if (dt == KVPAGER_DTYPE_FP32) f32.resize(n); else b16.resize(n);
  }
  void set(std::size_t i, float x) {
    if (dtype == KVPAGER_DTYPE_FP32) f32[i] = std::bit_cast<std::uint32_t>(x); else b16[i] = detail::float_to_bf16(x);
  }
  [[nodiscard]] double get(std::size_t i) const {
    return dtype == KVPAGER_DTYPE_FP32 ? static_cast<double>(std::bit_cast<float>(f32[i])) : detail::bf16_to_float(b16[i]);
  }
  void* data() { return dtype == KVPAGER_DTYPE_FP32 ? static_cast<void*>(f32.data()) : static_cast<void*>(b16.data()); }
  [[nodiscard]] std::size_t bytes() const { return f32.size() * 4 + b16.size() * 2; }
};

/// Writes the KV of tokens[first, first + count) (positions first..) through `slots` with kv_append.
void append(buffer& pool, std::span<const token_id> tokens, std::int32_t first, std::int32_t count,
            std::span<const std::int64_t> slots, std::int32_t dtype) {
  buffer k(dtype, static_cast<std::size_t>(count * kHkv * kD)), v(dtype, static_cast<std::size_t>(count * kHkv * kD));
  for (std::int32_t t = 0; t < count; ++t)
    for (std::int32_t h = 0; h < kHkv; ++h)
      for (std::int32_t d = 0; d < kD; ++d) {
        const auto i = static_cast<std::size_t>((t * kHkv + h) * kD + d);
        const token_id tok = tokens[static_cast<std::size_t>(first + t)];
        k.set(i, kv_value(tok, first + t, 0, h, d));
        v.set(i, kv_value(tok, first + t, 1, h, d));
      }
  ASSERT_EQ(kvpager_cpu_kv_append(pool.data(), k.data(), v.data(), slots.data(), count, kHkv, kD, kBs, kBlocks, dtype),
            KVPAGER_STATUS_OK);
}

/// Queries of tokens[first, first + count).
buffer queries(std::span<const token_id> tokens, std::int32_t first, std::int32_t count, std::int32_t dtype) {
  buffer q(dtype, static_cast<std::size_t>(count * kHq * kD));
  for (std::int32_t t = 0; t < count; ++t)
    for (std::int32_t h = 0; h < kHq; ++h)
      for (std::int32_t d = 0; d < kD; ++d)
        q.set(static_cast<std::size_t>((t * kHq + h) * kD + d), q_value(tokens[static_cast<std::size_t>(first + t)], first + t, h, d));
  return q;
}

/// The prompt's last `q_len` rows computed in a fresh pool (blocks 0, 1, ... in order, every token's KV written),
/// no cache involved.
buffer prefill_without_cache(std::span<const token_id> prompt, std::int32_t q_len, std::int32_t window, std::int32_t dtype) {
  const auto len = static_cast<std::int32_t>(prompt.size());
  buffer pool(dtype, static_cast<std::size_t>(kBlocks) * 2 * kHkv * kBs * kD);
  std::vector<std::int64_t> slots(prompt.size());
  for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<std::int64_t>(i);
  append(pool, prompt, 0, len, slots, dtype);
  const std::int32_t blocks = (len + kBs - 1) / kBs;
  std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
  for (std::int32_t b = 0; b < blocks; ++b) table[static_cast<std::size_t>(b)] = b;
  const std::int32_t qo[] = {0, len}, lens[] = {len};
  buffer q = queries(prompt, 0, len, dtype), out(dtype, static_cast<std::size_t>(len * kHq * kD));
  EXPECT_EQ(kvpager_cpu_paged_attention_prefill(out.data(), q.data(), pool.data(), qo, table.data(), lens, 1, kHq, kHkv,
                                                kD, kBs, blocks, kBlocks, 0.125F, window, 0.0F, dtype, 0),
            KVPAGER_STATUS_OK);
  // Keep the last q_len rows.
  buffer tail(dtype, static_cast<std::size_t>(q_len * kHq * kD));
  const std::size_t skip = static_cast<std::size_t>((len - q_len) * kHq * kD);
  for (std::size_t i = 0; i < static_cast<std::size_t>(q_len * kHq * kD); ++i) tail.set(i, static_cast<float>(out.get(skip + i)));
  return tail;
}

void run(std::int32_t dtype, std::int32_t window) {
  auto cache = *vllm_v1_cache::create({kBs, kBlocks, 1, 0});
  buffer pool(dtype, static_cast<std::size_t>(kBlocks) * 2 * kHkv * kBs * kD);
  std::vector<token_id> first(70), second(107);
  for (std::size_t i = 0; i < first.size(); ++i) first[i] = static_cast<token_id>(1000 + i);
  for (std::size_t i = 0; i < second.size(); ++i) second[i] = i < 56 ? first[i] : static_cast<token_id>(5000 + i);
  // Request 1 admits its prompt and writes all of its KV (its prefill); its 4 full blocks are cached.
  ASSERT_TRUE(cache.add_sequence(1, first));
  std::vector<std::int64_t> slots(static_cast<std::size_t>(cache.slot_mapping_size()));
  ASSERT_EQ(slots.size(), first.size());
  ASSERT_TRUE(cache.export_slot_mapping(slots));
  append(pool, first, 0, 70, slots, dtype);
  cache.begin_step();
  // Request 2 shares 56 tokens: 3 full blocks (48 tokens) hit; only tokens 48.. are appended.
  prefix_hit hit;
  ASSERT_TRUE(cache.match_prefix(second, {}, hit));
  ASSERT_EQ(hit.match.blocks, 3);
  ASSERT_TRUE(cache.add_sequence(2, second, {}, hit));
  ASSERT_TRUE(cache.plan().copies().empty());
  ASSERT_EQ(cache.plan().appends().size(), 1U);
  const token_range r = cache.plan().appends()[0];
  ASSERT_EQ(r.seq, 2U);
  ASSERT_EQ(r.first_pos, 48);
  ASSERT_EQ(r.count, 107 - 48);
  slots.assign(static_cast<std::size_t>(cache.slot_mapping_size()), -1);
  ASSERT_TRUE(cache.export_slot_mapping(slots));
  append(pool, second, r.first_pos, r.count, slots, dtype);
  // Prefill of the missed rows over the block table the cache exports.
  const seq_id ids[] = {2};
  std::vector<std::int32_t> table(8, -1), lens(1);
  ASSERT_TRUE(cache.export_block_table(ids, table, 8, lens));
  ASSERT_EQ(lens[0], 107);
  EXPECT_EQ(table[0], (*cache.block_table(1))[0]) << "the shared blocks are request 1's";
  const std::int32_t qo[] = {0, r.count};
  buffer q = queries(second, r.first_pos, r.count, dtype), out(dtype, static_cast<std::size_t>(r.count * kHq * kD));
  ASSERT_EQ(kvpager_cpu_paged_attention_prefill(out.data(), q.data(), pool.data(), qo, table.data(), lens.data(), 1, kHq,
                                                kHkv, kD, kBs, 8, kBlocks, 0.125F, window, 0.0F, dtype, 0),
            KVPAGER_STATUS_OK);
  const buffer want = prefill_without_cache(second, r.count, window, dtype);
  if (window < 0) {
    // Same KV values, same KV tiles from position 0, rows independent: bit for bit.
    EXPECT_EQ(std::memcmp(out.data(), const_cast<buffer&>(want).data(), out.bytes()), 0);
  }
  const double tol = dtype == KVPAGER_DTYPE_FP32 ? 1e-5 : 1e-2;
  for (std::int32_t row = 0; row < r.count; ++row)
    for (std::int32_t i = 0; i < kHq * kD; ++i) {
      const auto at = static_cast<std::size_t>(row * kHq * kD + i);
      ASSERT_NEAR(out.get(at), want.get(at), tol * (1.0 + std::abs(want.get(at)))) << "row " << row << " element " << i;
    }
}

TEST(PrefixPrefill, CacheHitThenMissedTokensOnlyMatchesWholePromptFp32) { run(KVPAGER_DTYPE_FP32, -1); }
TEST(PrefixPrefill, CacheHitThenMissedTokensOnlyMatchesWholePromptBf16) { run(KVPAGER_DTYPE_BF16, -1); }
TEST(PrefixPrefill, CacheHitWithSlidingWindow) { run(KVPAGER_DTYPE_FP32, 20); }

}  // namespace
