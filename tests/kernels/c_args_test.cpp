// SPDX-License-Identifier: Apache-2.0
// The struct-taking C entry points (kvpager_cpu_decode, kvpager_cpu_prefill, kvpager_cpu_append; issue 22, point 3):
// each is the C++ operation with the same arguments (same bytes out, same status for every bad input), over views
// and page tables the positional functions cannot express (NHD strides, CSR pages, fp8 pools with scales, LSE), and
// the struct_size rule of the C ABI policy (CHANGELOG): smaller is refused, larger is accepted only with a zero tail,
// and a refused call writes nothing.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/block_moves.hpp>
#include <kvpager/kernels/prefill.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "paged_tables.hpp"

using namespace kvpager;
using kvpager_prefill_test::paged_tables;

namespace {

std::int32_t code(const status& st) { return st.ok() ? KVPAGER_STATUS_OK : static_cast<std::int32_t>(st.detail()); }

kvpager_kv_view c_view(const paged_kv_view& v) {
  kvpager_kv_view c = KVPAGER_KV_VIEW_INIT;
  c.data = v.data;
  c.dtype = v.dtype;
  c.num_blocks = v.num_blocks;
  c.num_kv_heads = v.num_kv_heads;
  c.block_size = v.block_size;
  c.head_dim = v.head_dim;
  c.stride_block = v.stride_block;
  c.stride_kv = v.stride_kv;
  c.stride_head = v.stride_head;
  c.stride_token = v.stride_token;
  return c;
}

kvpager_page_table c_pages(const page_table_view& t) {
  return {t.block_table, t.row_stride, t.seq_lens, t.indptr, t.indices, t.last_page_len};
}

/// The fields a decode and a prefill share, into their C struct (Args) from their params (Params).
template <class Args, class Params>
Args c_attention(const Params& p, Args a) {
  a.num_seqs = p.num_seqs;
  a.out = p.out;
  a.query = p.query;
  a.lse = p.lse;
  a.kv = c_view(p.kv);
  a.pages = c_pages(p.pages);
  a.num_q_heads = p.num_q_heads;
  a.scale = p.scale;
  a.window_left = p.window_left;
  a.logits_soft_cap = p.logits_soft_cap;
  a.num_threads = p.num_threads;
  a.q_dtype = p.q_dtype;
  a.k_scale = p.k_scale;
  a.v_scale = p.v_scale;
  return a;
}

kvpager_decode_args c_decode(const decode_params& p) {
  kvpager_decode_args a = c_attention(p, kvpager_decode_args KVPAGER_DECODE_ARGS_INIT);
  a.num_splits = p.num_splits;
  a.workspace = p.workspace;
  a.workspace_bytes = p.workspace_bytes;
  return a;
}

kvpager_prefill_args c_prefill(const prefill_params& p) {
  kvpager_prefill_args a = c_attention(p, kvpager_prefill_args KVPAGER_PREFILL_ARGS_INIT);
  a.qo_indptr = p.qo_indptr;
  return a;
}

/// Runs the C++ operation (cpp) and the struct entry point (c) on the same params into separate buffers of `out_n`
/// outputs and `lse_n` LSE values: both succeed and write the same bytes.
template <class Params, class Cpp, class C, class ToC>
void expect_same_bytes(Params p, std::size_t out_n, std::size_t lse_n, Cpp cpp, C c, ToC to_c) {
  std::vector<float> out_cpp(out_n, -7.0F), out_c(out_n, -7.0F), lse_cpp(lse_n), lse_c(lse_n);
  p.out = out_cpp.data();
  p.lse = lse_cpp.data();
  ASSERT_TRUE(cpp(p).ok());
  auto a = to_c(p);
  a.out = out_c.data();
  a.lse = lse_c.data();
  ASSERT_EQ(c(&a), KVPAGER_STATUS_OK);
  EXPECT_EQ(0, std::memcmp(out_c.data(), out_cpp.data(), out_n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(lse_c.data(), lse_cpp.data(), lse_n * sizeof(float)));
  EXPECT_NE(out_c[0], -7.0F);
}

/// An fp8 NHD pool (K and V interleaved per block) filled through kv_append from fp32 K/V, over CSR and dense tables.
struct fp8_batch {
  static constexpr std::int32_t hkv = 2, hq = 8, dim = 64, bs = 16;
  std::vector<std::int32_t> lens{37, 1, 80}, q_lens{5, 1, 16};
  std::mt19937 rng{2212};
  paged_tables t{lens, q_lens, bs, 3, rng};
  std::vector<std::uint8_t> pool;
  paged_kv_view view;
  std::vector<float> q;
  float k_scale = 0.05F, v_scale = 0.02F;

  fp8_batch() {
    pool.assign(static_cast<std::size_t>(t.num_blocks) * 2 * bs * hkv * dim, 0);
    view = paged_kv_view::nhd(pool.data(), KVPAGER_DTYPE_FP8_E4M3, t.num_blocks, hkv, bs, dim);
    std::uniform_real_distribution<float> u(-1.0F, 1.0F);
    std::int32_t tokens = 0;
    for (const std::int32_t len : lens) tokens += len;
    std::vector<float> k(static_cast<std::size_t>(tokens) * hkv * dim), v(k.size());
    for (float& x : k) x = u(rng) * 8.0F;
    for (float& x : v) x = u(rng) * 4.0F;
    std::vector<std::int64_t> slots;
    for (std::size_t s = 0; s < lens.size(); ++s)
      for (std::int32_t j = 0; j < lens[s]; ++j)
        slots.push_back(t.block(static_cast<std::int32_t>(s), j, bs) * bs + j % bs);
    // The pool is written by the struct entry point; the C++ operation must write the same bytes.
    kvpager_append_args a = KVPAGER_APPEND_ARGS_INIT;
    a.num_tokens = tokens;
    a.kv = c_view(view);
    a.key = k.data();
    a.value = v.data();
    a.slot_mapping = slots.data();
    a.src_dtype = KVPAGER_DTYPE_FP32;
    a.k_scale = k_scale;
    a.v_scale = v_scale;
    EXPECT_EQ(kvpager_cpu_append(&a), KVPAGER_STATUS_OK);
    std::vector<std::uint8_t> again(pool.size(), 0);
    append_params p;
    p.kv = paged_kv_view::nhd(again.data(), KVPAGER_DTYPE_FP8_E4M3, t.num_blocks, hkv, bs, dim);
    p.key = k.data();
    p.value = v.data();
    p.slot_mapping = slots.data();
    p.num_tokens = tokens;
    p.src_dtype = KVPAGER_DTYPE_FP32;
    p.k_scale = k_scale;
    p.v_scale = v_scale;
    EXPECT_TRUE(kv_append_cpu(p).ok());
    EXPECT_EQ(again, pool);
    q.resize(static_cast<std::size_t>(t.qo.back()) * hq * dim);
    for (float& x : q) x = u(rng);
  }
};

}  // namespace

TEST(CStructEntryPoints, DecodeIsTheCppOperationOverNhdCsrAndFp8) {
  fp8_batch b;
  for (const bool csr : {false, true}) {
    SCOPED_TRACE(csr ? "csr" : "dense");
    prefill_params f;
    b.t.set_pages(f, csr, b.lens);
    decode_params p;
    p.query = b.q.data();
    p.kv = b.view;
    p.pages = f.pages;
    p.num_seqs = f.num_seqs;
    p.num_q_heads = b.hq;
    p.scale = 0.125F;
    p.num_splits = 2;
    p.window_left = 40;
    p.logits_soft_cap = 30.0F;
    p.q_dtype = KVPAGER_DTYPE_FP32;
    p.k_scale = b.k_scale;
    p.v_scale = b.v_scale;
    const std::size_t rows = b.lens.size() * b.hq;
    expect_same_bytes(p, rows * b.dim, rows, paged_attention_decode_cpu, kvpager_cpu_decode, c_decode);
  }
}

TEST(CStructEntryPoints, PrefillIsTheCppOperationOverNhdCsrAndFp8) {
  fp8_batch b;
  for (const bool csr : {false, true}) {
    SCOPED_TRACE(csr ? "csr" : "dense");
    prefill_params p;
    p.query = b.q.data();
    p.kv = b.view;
    b.t.set_pages(p, csr, b.lens);
    p.num_q_heads = b.hq;
    p.scale = 0.125F;
    p.window_left = 24;
    p.q_dtype = KVPAGER_DTYPE_FP32;
    p.k_scale = b.k_scale;
    p.v_scale = b.v_scale;
    const std::size_t rows = static_cast<std::size_t>(b.t.qo.back()) * b.hq;
    expect_same_bytes(p, rows * b.dim, rows, paged_attention_prefill_cpu, kvpager_cpu_prefill, c_prefill);
  }
}

TEST(CStructEntryPoints, EveryBadInputGetsTheCppAnswerAndWritesNothing) {
  fp8_batch b;
  prefill_params good;
  std::vector<float> out(b.q.size(), -7.0F);
  good.query = b.q.data();
  good.out = out.data();
  good.kv = b.view;
  b.t.set_pages(good, true, b.lens);
  good.num_q_heads = b.hq;
  good.scale = 0.125F;
  good.q_dtype = KVPAGER_DTYPE_FP16;
  good.k_scale = b.k_scale;
  good.v_scale = b.v_scale;
  std::vector<std::int32_t> bad_indices = b.t.indices;
  bad_indices[2] = b.t.num_blocks;
  std::vector<std::int32_t> bad_qo = b.t.qo;
  bad_qo[1] = bad_qo[2] + 1;
  const std::vector<void (*)(prefill_params&)> breaks = {
      [](prefill_params& p) { p.num_q_heads = 3; },
      [](prefill_params& p) { p.kv.head_dim = 100; },
      [](prefill_params& p) { p.kv.block_size = 12; },
      [](prefill_params& p) { p.q_dtype = KVPAGER_DTYPE_FP8_E4M3; },
      [](prefill_params& p) { p.q_dtype = -1; },
      [](prefill_params& p) { p.q_dtype = 9; },
      [](prefill_params& p) { p.k_scale = 0.0F; },
      [](prefill_params& p) { p.scale = 1.0F / 0.0F; },
      [](prefill_params& p) { p.window_left = -2; },
      [](prefill_params& p) { p.logits_soft_cap = -1.0F; },
      [](prefill_params& p) { p.num_threads = -1; },
      [](prefill_params& p) { p.kv.stride_token = -1; },
      [](prefill_params& p) { p.query = nullptr; },
      [](prefill_params& p) { p.pages.last_page_len = nullptr; },
      [](prefill_params& p) { p.qo_indptr = nullptr; },
      [](prefill_params& p) { p.kv.num_blocks = 1; },
  };
  std::int32_t refused = 0;
  const std::vector<float> before = out;
  for (std::size_t i = 0; i < breaks.size() + 2; ++i) {
    prefill_params p = good;
    if (i < breaks.size()) breaks[i](p);
    if (i == breaks.size()) p.pages.indices = bad_indices.data();
    if (i == breaks.size() + 1) p.qo_indptr = bad_qo.data();
    const std::int32_t want = code(paged_attention_prefill_cpu(p));
    EXPECT_NE(want, KVPAGER_STATUS_OK) << i;
    kvpager_prefill_args a = c_prefill(p);
    EXPECT_EQ(kvpager_cpu_prefill(&a), want) << i;
    // The decode of the same fields (its rows are one per sequence: the qo_indptr cases do not apply).
    if (p.qo_indptr != nullptr && p.qo_indptr == b.t.qo.data()) {
      const decode_params d = decode_params_of(p);
      const kvpager_decode_args da = c_decode(d);
      EXPECT_EQ(kvpager_cpu_decode(&da), code(paged_attention_decode_cpu(d))) << i;
    }
    ++refused;
  }
  EXPECT_EQ(refused, static_cast<std::int32_t>(breaks.size()) + 2);
  EXPECT_EQ(before, out) << "a refused call wrote its output";
}

TEST(CStructEntryPoints, StructSizeSmallerIsRefusedLargerNeedsAZeroTail) {
  fp8_batch b;
  prefill_params p;
  std::vector<float> out(b.q.size(), -7.0F);
  p.query = b.q.data();
  p.out = out.data();
  p.kv = b.view;
  b.t.set_pages(p, false, b.lens);
  p.num_q_heads = b.hq;
  p.q_dtype = KVPAGER_DTYPE_BF16;
  p.k_scale = b.k_scale;
  p.v_scale = b.v_scale;
  // A caller built against a later header: this release's fields, then more.
  struct later {
    kvpager_prefill_args a;
    std::uint64_t more[2];
  } l{};
  l.a = c_prefill(p);
  const std::vector<float> before = out;
  EXPECT_EQ(kvpager_cpu_prefill(nullptr), KVPAGER_STATUS_INVALID_ARGUMENT);
  l.a.struct_size = sizeof(kvpager_prefill_args) - 4;
  EXPECT_EQ(kvpager_cpu_prefill(&l.a), KVPAGER_STATUS_INVALID_ARGUMENT);
  l.a.struct_size = 0;
  EXPECT_EQ(kvpager_cpu_prefill(&l.a), KVPAGER_STATUS_INVALID_ARGUMENT);
  l.a.struct_size = sizeof(later);
  l.more[1] = 1;
  EXPECT_EQ(kvpager_cpu_prefill(&l.a), KVPAGER_STATUS_INVALID_ARGUMENT);
  l.a.kv.reserved = 1;
  l.more[1] = 0;
  EXPECT_EQ(kvpager_cpu_prefill(&l.a), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(before, out) << "a refused call wrote its output";
  l.a.kv.reserved = 0;
  EXPECT_EQ(kvpager_cpu_prefill(&l.a), KVPAGER_STATUS_OK);
  EXPECT_NE(before, out);

  kvpager_decode_args d = KVPAGER_DECODE_ARGS_INIT;
  EXPECT_EQ(d.struct_size, sizeof(kvpager_decode_args));
  EXPECT_EQ(kvpager_cpu_decode(&d), KVPAGER_STATUS_BAD_HEADS);  // the defaults: no heads yet
  d.reserved = 1;
  EXPECT_EQ(kvpager_cpu_decode(&d), KVPAGER_STATUS_INVALID_ARGUMENT);
  d.reserved = 0;
  d.struct_size = 8;
  EXPECT_EQ(kvpager_cpu_decode(&d), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvpager_cpu_decode(nullptr), KVPAGER_STATUS_INVALID_ARGUMENT);
  kvpager_append_args a = KVPAGER_APPEND_ARGS_INIT;
  EXPECT_EQ(kvpager_cpu_append(&a), KVPAGER_STATUS_BAD_HEADS);
  a.struct_size = sizeof(kvpager_append_args) - 1;
  EXPECT_EQ(kvpager_cpu_append(&a), KVPAGER_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(kvpager_cpu_append(nullptr), KVPAGER_STATUS_INVALID_ARGUMENT);
}

TEST(CStructEntryPoints, InitializersAreTheCppDefaults) {
  const kvpager_decode_args d = KVPAGER_DECODE_ARGS_INIT;
  const decode_params dp;
  EXPECT_EQ(d.kv.dtype, dp.kv.dtype);
  EXPECT_EQ(d.kv.block_size, dp.kv.block_size);
  EXPECT_EQ(d.kv.head_dim, dp.kv.head_dim);
  EXPECT_EQ(d.scale, dp.scale);
  EXPECT_EQ(d.num_splits, dp.num_splits);
  EXPECT_EQ(d.window_left, dp.window_left);
  EXPECT_EQ(d.logits_soft_cap, dp.logits_soft_cap);
  EXPECT_EQ(d.q_dtype, dp.q_dtype);
  EXPECT_EQ(d.k_scale, dp.k_scale);
  EXPECT_EQ(d.v_scale, dp.v_scale);
  const kvpager_prefill_args p = KVPAGER_PREFILL_ARGS_INIT;
  const prefill_params pp;
  EXPECT_EQ(p.struct_size, sizeof(kvpager_prefill_args));
  EXPECT_EQ(p.scale, pp.scale);
  EXPECT_EQ(p.window_left, pp.window_left);
  EXPECT_EQ(p.q_dtype, pp.q_dtype);
  EXPECT_EQ(p.k_scale, pp.k_scale);
  const kvpager_append_args a = KVPAGER_APPEND_ARGS_INIT;
  const append_params ap;
  EXPECT_EQ(a.struct_size, sizeof(kvpager_append_args));
  EXPECT_EQ(a.src_dtype, ap.src_dtype);
  EXPECT_EQ(a.v_scale, ap.v_scale);
}
