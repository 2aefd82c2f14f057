// SPDX-License-Identifier: Apache-2.0
#pragma once
// A rank's KV pools for transfer tests: its kv_side, its regions' bytes (a sentinel everywhere but a request's
// tokens), a request's block tables, and an inproc_transport with the regions registered; the content every token
// of a request has, so a receiver's pools are checked byte for byte against what they must hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "kvpager/core/splitmix.hpp"
#include "kvpager/transfer/inproc_transport.hpp"
#include "kvpager/transfer/kv_runs.hpp"

namespace kvpager::test {

/// The model both sides serve.
struct model {
  std::int32_t num_kv_heads = 2;
  std::int32_t num_layers = 2;
  std::int32_t num_q_heads = 4;
  std::int32_t head_dim = 16;
  kv_dtype dtype = kv_dtype::f16;
};

inline constexpr std::byte sentinel{0xA5};

/// Element `d` of head `head` (of the model) of token `t`'s K (kv 0) or V (kv 1) in layer `layer`, as bytes.
inline std::uint64_t kv_value(std::int32_t layer, std::int64_t t, std::int32_t kv, std::int32_t head, std::int32_t d) {
  std::uint64_t x = (static_cast<std::uint64_t>(layer) << 48) ^ (static_cast<std::uint64_t>(t) << 20) ^
                    (static_cast<std::uint64_t>(kv) << 19) ^ (static_cast<std::uint64_t>(head) << 10) ^
                    static_cast<std::uint64_t>(d);
  return splitmix64(x);
}

struct kv_rank {
  kv_side side{};
  std::vector<std::vector<std::byte>> regions;
  std::vector<std::vector<block_id>> tables;
  std::vector<std::int32_t> layer_groups;
  block_id null_block = no_block;
  inproc_transport transport;
  std::vector<mem_handle> handles;
  std::vector<block_id> unused;  // blocks no table holds yet
  std::vector<std::span<const block_id>> views;

  static kv_rank make(const model& m, std::int32_t block_size, std::int32_t tp, std::int32_t rank,
                      kv_pool_layout layout, std::int64_t tokens, std::mt19937_64& rng) {
    kv_rank r;
    const std::int32_t entries = static_cast<std::int32_t>((tokens + block_size - 1) / block_size);
    const kv_geometry g{2 * entries + 8, block_size, m.num_kv_heads, m.head_dim, m.dtype};
    const result<tp_rank_layout> rl = rank_layout(g, m.num_q_heads, tp, rank);
    EXPECT_TRUE(rl.ok()) << rl.error().message();
    r.side = kv_side{*rl, m.num_layers, layout};
    for (std::int32_t i = 0; i < r.side.num_regions(); ++i)
      r.regions.emplace_back(static_cast<std::size_t>(r.side.region_bytes()), sentinel);
    for (auto& reg : r.regions) r.handles.push_back(*r.transport.register_memory(reg.data(), reg.size()));
    r.unused.resize(static_cast<std::size_t>(g.num_blocks - 1));
    std::iota(r.unused.begin(), r.unused.end(), 1);  // block 0 is kept out, as a hybrid cache's null block
    std::shuffle(r.unused.begin(), r.unused.end(), rng);
    r.add_group(tokens, rng);
    return r;
  }

  /// A new block table for the request (a group): fresh blocks, consecutive ones half the time.
  void add_group(std::int64_t tokens, std::mt19937_64& rng) {
    const std::int32_t bs = side.rank.geometry.block_size;
    const auto entries = static_cast<std::size_t>((tokens + bs - 1) / bs);
    std::vector<block_id> t(unused.end() - static_cast<std::ptrdiff_t>(entries), unused.end());
    unused.resize(unused.size() - entries);
    if (rng() % 2 == 0) std::sort(t.begin(), t.end());
    tables.push_back(std::move(t));
  }

  kv_tables tables_view() {
    views.assign(tables.begin(), tables.end());
    return kv_tables{views, layer_groups, null_block};
  }

  /// Writes the request's content for the heads this rank holds into `into` (regions of this rank's layout).
  void write_request(std::vector<std::vector<std::byte>>& into, const model& m, std::int64_t tokens,
                     std::int64_t first = 0) const {
    const kv_geometry& g = side.rank.geometry;
    const std::int32_t eb = elem_bytes(g.dtype);
    for (std::int32_t l = 0; l < m.num_layers; ++l) {
      const std::size_t grp = layer_groups.empty() ? 0 : static_cast<std::size_t>(layer_groups[static_cast<std::size_t>(l)]);
      for (std::int64_t t = first; t < tokens; ++t) {
        const block_id b = tables[grp][static_cast<std::size_t>(t / g.block_size)];
        if (b == null_block) continue;
        for (std::int32_t kv = 0; kv < 2; ++kv)
          for (std::int32_t h = 0; h < g.num_kv_heads; ++h) {
            std::byte* p = into[static_cast<std::size_t>(side.region(l))].data() +
                           side.offset(l, b, kv, h, static_cast<std::int32_t>(t % g.block_size));
            for (std::int32_t d = 0; d < g.head_dim; ++d) {
              const std::uint64_t v = kv_value(l, t, kv, side.rank.kv_head_begin + h, d);
              std::memcpy(p + static_cast<std::ptrdiff_t>(d) * eb, &v, static_cast<std::size_t>(eb));
            }
          }
      }
    }
  }
  void fill_request(const model& m, std::int64_t tokens) { write_request(regions, m, tokens); }

  /// The regions hold exactly the request's content of tokens [first, tokens) for this rank's heads, and the
  /// sentinel everywhere else.
  [[nodiscard]] bool request_matches(const model& m, std::int64_t tokens, std::int64_t first = 0) const {
    std::vector<std::vector<std::byte>> expect;
    for (const auto& reg : regions) expect.emplace_back(reg.size(), sentinel);
    write_request(expect, m, tokens, first);
    return expect == regions;
  }
};

/// Moves the request's tokens [first, tokens) from sender `s` into receiver `d` over a new inproc connection:
/// plan_kv_runs, then one read. The bytes moved.
inline std::int64_t move_request(kv_rank& s, kv_rank& d, std::int64_t tokens, std::int64_t first = 0) {
  const auto [sp, dp] = inproc_transport::connect(s.transport, d.transport);
  (void)sp;
  std::vector<remote_handle> remotes;
  std::vector<std::byte> desc;
  for (const mem_handle h : s.handles) {
    EXPECT_TRUE(s.transport.describe(h, desc).ok());
    const result<remote_handle> r = d.transport.import_remote(dp, desc);
    EXPECT_TRUE(r.ok());
    remotes.push_back(*r);
  }
  std::vector<kv_run> runs;
  const status st = plan_kv_runs(s.side, s.tables_view(), d.side, d.tables_view(), first, tokens - first, runs);
  EXPECT_TRUE(st.ok()) << st.message();
  const result<transfer_handle> x = d.transport.read(dp, runs, remotes, d.handles);
  EXPECT_TRUE(x.ok()) << x.error().message();
  EXPECT_EQ(*d.transport.poll(*x), transfer_state::done);
  return run_bytes(runs);
}

}  // namespace kvpager::test
