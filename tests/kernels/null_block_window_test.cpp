// SPDX-License-Identifier: Apache-2.0
// Attention over a sliding-window group's tables from hybrid_kv_cache (issue 24, point 4): the entries before the
// window are the null block (block 0), which every sequence's table names and which another request may reuse, so
// the tests fill it with NaN. The decode and prefill kernels never read it: their outputs are finite and equal an
// fp64 reference over each query's window, for windows shorter and longer than a block, dense and CSR tables, one
// and two threads.
#include <kvpager/kernels/attention.hpp>
#include <kvpager/kernels/prefill.hpp>
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

using namespace kvpager;

namespace {

constexpr std::int32_t hq = 4, hkv = 2, D = 64, bs = 8;

struct window_case {
  std::int32_t window_left;  // the kernels' window: the query sees its last window_left + 1 positions
  std::int32_t threads;
  bool csr;
};

/// Runs sequences through a hybrid cache of one sliding-window group until their windows released blocks, fills
/// the pool (block 0 NaN, every other block random), and checks decode (one query per sequence) and prefill (the
/// last `q` positions of each sequence as a chunk) against the reference.
void check_window(const window_case& wc, std::uint32_t seed) {
  using cache_type = hybrid_kv_cache<sliding_window>;
  cache_config cfg;
  cfg.block_size = bs;
  cfg.num_blocks = 1 + 400;
  cfg.reserved_blocks = 1;
  const std::vector<sliding_window> groups{sliding_window{wc.window_left + 1}};
  auto made = cache_type::create(cfg, groups);
  ASSERT_TRUE(made);
  cache_type& cache = *made;
  const std::vector<std::int32_t> prompts{3, 20, 41, 64};
  const std::vector<std::int32_t> decodes{60, 37, 90, 5};
  std::vector<seq_id> ids;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(cache.add_sequence(static_cast<seq_id>(i), prompts[i]));
    ids.push_back(static_cast<seq_id>(i));
  }
  for (std::size_t i = 0; i < prompts.size(); ++i)
    for (std::int32_t t = 0; t < decodes[i]; ++t) {
      cache.begin_step();
      ASSERT_TRUE(cache.append_tokens(static_cast<seq_id>(i)));
    }
  ASSERT_GT(cache.stats(0).skipped_blocks, 0) << "the windows released nothing";
  const std::int32_t stride = 32;
  std::vector<std::int32_t> table(ids.size() * stride), lens(ids.size());
  ASSERT_TRUE(cache.export_block_table(0, ids, table, stride, lens));
  std::vector<std::int32_t> indptr(ids.size() + 1), indices(static_cast<std::size_t>(*cache.csr_size(0, ids))),
      last(ids.size());
  ASSERT_TRUE(cache.export_csr(0, ids, indptr, indices, last));
  std::int64_t nulls = 0;
  for (const std::int32_t b : indices) nulls += b == cache_type::null_block ? 1 : 0;
  ASSERT_GT(nulls, 0);

  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0F, 1.0F);
  const paged_kv_view view = paged_kv_view::hnd(nullptr, KVPAGER_DTYPE_FP32, cfg.num_blocks, hkv, bs, D);
  std::vector<float> kv(static_cast<std::size_t>(view.stride_block) * static_cast<std::size_t>(cfg.num_blocks));
  for (std::size_t i = 0; i < kv.size(); ++i)
    kv[i] = i < static_cast<std::size_t>(view.stride_block) ? std::numeric_limits<float>::quiet_NaN() : uni(rng);
  paged_kv_view v = view;
  v.data = kv.data();
  const auto element = [&](std::size_t s, std::int32_t pos, std::int32_t k, std::int32_t h, std::int32_t e) {
    const std::int32_t b = table[s * stride + static_cast<std::size_t>(pos / bs)];
    return static_cast<double>(kv[static_cast<std::size_t>(b * view.stride_block + k * view.stride_kv +
                                                          h * view.stride_head + (pos % bs) * view.stride_token + e)]);
  };
  const float scale = 0.125F;
  // The reference for a query of sequence s at position p over [max(0, p - window_left), p].
  const auto reference = [&](std::size_t s, std::int32_t p, const float* q, std::int32_t h, std::vector<double>& o) {
    const std::int32_t first = std::max(0, p - wc.window_left);
    std::vector<double> w;
    double mx = -INFINITY;
    for (std::int32_t t = first; t <= p; ++t) {
      double dot = 0;
      for (std::int32_t e = 0; e < D; ++e) dot += static_cast<double>(q[e]) * element(s, t, 0, h / (hq / hkv), e);
      w.push_back(dot * scale);
      mx = std::max(mx, w.back());
    }
    double sum = 0;
    for (double& x : w) sum += (x = std::exp(x - mx));
    o.assign(D, 0.0);
    for (std::int32_t t = first; t <= p; ++t)
      for (std::int32_t e = 0; e < D; ++e)
        o[static_cast<std::size_t>(e)] += w[static_cast<std::size_t>(t - first)] / sum * element(s, t, 1, h / (hq / hkv), e);
  };
  page_table_view pages;
  if (wc.csr) {
    pages.indptr = indptr.data();
    pages.indices = indices.data();
    pages.last_page_len = last.data();
  } else {
    pages.block_table = table.data();
    pages.row_stride = stride;
    pages.seq_lens = lens.data();
  }

  // Decode: one query per sequence at its last position.
  std::vector<float> q(ids.size() * hq * D), out(q.size(), 7.0F);
  for (float& x : q) x = uni(rng);
  decode_params dp;
  dp.out = out.data();
  dp.query = q.data();
  dp.kv = v;
  dp.pages = pages;
  dp.num_seqs = static_cast<std::int32_t>(ids.size());
  dp.num_q_heads = hq;
  dp.scale = scale;
  dp.num_threads = wc.threads;
  dp.window_left = wc.window_left;
  dp.q_dtype = KVPAGER_DTYPE_FP32;
  std::vector<float> workspace;
  if (const std::int64_t ws = decode_workspace_size(dp); ws > 0) {
    workspace.resize(static_cast<std::size_t>((ws + 3) / 4));
    dp.workspace = workspace.data();
    dp.workspace_bytes = ws;
  }
  ASSERT_TRUE(paged_attention_decode_cpu(dp));
  std::vector<double> o;
  for (std::size_t s = 0; s < ids.size(); ++s)
    for (std::int32_t h = 0; h < hq; ++h) {
      reference(s, lens[s] - 1, q.data() + (s * hq + static_cast<std::size_t>(h)) * D, h, o);
      for (std::int32_t e = 0; e < D; ++e) {
        const double got = out[(s * hq + static_cast<std::size_t>(h)) * D + static_cast<std::size_t>(e)];
        ASSERT_TRUE(std::isfinite(got)) << "decode read the null block: sequence " << s << " window " << wc.window_left;
        ASSERT_NEAR(got, o[static_cast<std::size_t>(e)], 1e-4 * (1.0 + std::abs(o[static_cast<std::size_t>(e)])));
      }
    }

  // Prefill: the last positions of each sequence as its chunk, up to 4, as far back as every row's window stays
  // past the null entries (a chunk appended in one call releases from its first token's window).
  std::vector<std::int32_t> qo{0};
  for (std::size_t s = 0; s < ids.size(); ++s) {
    std::int32_t null_end = 0;
    while (table[s * stride + static_cast<std::size_t>(null_end)] == cache_type::null_block) ++null_end;
    const std::int32_t room = lens[s] - wc.window_left - null_end * bs;
    ASSERT_GE(room, 1) << "the window release went past the next token's window";
    qo.push_back(qo.back() + std::min({4, lens[s], room}));
  }
  std::vector<float> pq(static_cast<std::size_t>(qo.back()) * hq * D), pout(pq.size(), 7.0F);
  for (float& x : pq) x = uni(rng);
  prefill_params pp;
  pp.out = pout.data();
  pp.query = pq.data();
  pp.kv = v;
  pp.pages = pages;
  pp.qo_indptr = qo.data();
  pp.num_seqs = static_cast<std::int32_t>(ids.size());
  pp.num_q_heads = hq;
  pp.scale = scale;
  pp.num_threads = wc.threads;
  pp.window_left = wc.window_left;
  pp.q_dtype = KVPAGER_DTYPE_FP32;
  ASSERT_TRUE(paged_attention_prefill_cpu(pp));
  for (std::size_t s = 0; s < ids.size(); ++s)
    for (std::int32_t r = qo[s]; r < qo[s + 1]; ++r) {
      const std::int32_t pos = lens[s] - (qo[s + 1] - r);
      for (std::int32_t h = 0; h < hq; ++h) {
        const std::size_t at = (static_cast<std::size_t>(r) * hq + static_cast<std::size_t>(h)) * D;
        reference(s, pos, pq.data() + at, h, o);
        for (std::int32_t e = 0; e < D; ++e) {
          const double got = pout[at + static_cast<std::size_t>(e)];
          ASSERT_TRUE(std::isfinite(got)) << "prefill read the null block: sequence " << s << " row " << r;
          ASSERT_NEAR(got, o[static_cast<std::size_t>(e)], 1e-4 * (1.0 + std::abs(o[static_cast<std::size_t>(e)])));
        }
      }
    }
}

TEST(NullBlockBeforeTheWindow, DecodeAndPrefillNeverReadIt) {
  std::uint32_t seed = 24;
  for (const std::int32_t window_left : {0, 3, 7, 8, 12, 31})
    for (const std::int32_t threads : {1, 2})
      for (const bool csr : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "window_left " << window_left << " threads " << threads << " csr " << csr);
        check_window({window_left, threads, csr}, seed++);
        if (::testing::Test::HasFatalFailure()) return;
      }
}

}  // namespace
