// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The bytes of a KV transfer between two caches: which runs of the sender's pools go where in the receiver's, for
/// a request's first tokens, every layer, K and V, and every KV head the two ranks share, whatever their block
/// sizes, tensor-parallel layouts and pool layouts (per layer or block-major). A transport (transport.hpp) moves
/// the runs; this header only plans them. Byte-exact: the element type and head size must be the same on both
/// sides (no conversion in flight).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/kernels/kv_layout.hpp"
#include "kvpager/sizing/tensor_parallel.hpp"

KVPAGER_NAMESPACE_BEGIN

/// One rank's KV memory as a transfer sees it: its share of the model's KV heads and its pools' geometry
/// (`rank`, from rank_layout; tensor-parallel degree 1: rank_layout(g, q_heads, 1, 0), every head), the layers, and
/// how the pools lie. Regions: with kv_pool_layout::per_layer, region l is layer l's pool; with block_major, region 0
/// is the one pool of every layer. Each region is `region_bytes()` long, in the kernels' layout (kv_layout).
struct kv_side {
  tp_rank_layout rank{};
  std::int32_t num_layers = 1;
  kv_pool_layout layout = kv_pool_layout::per_layer;

  /// Every KV head of the model (the unsplit count): the rank's heads times the ranks that split them.
  [[nodiscard]] constexpr std::int32_t model_kv_heads() const noexcept {
    return rank.kv_replicas > 1 ? rank.tp / rank.kv_replicas : rank.geometry.num_kv_heads * rank.tp;
  }
  [[nodiscard]] constexpr std::int32_t num_regions() const noexcept {
    return layout == kv_pool_layout::block_major ? 1 : num_layers;
  }
  /// Bytes of one region (block_bytes(geometry) x blocks, times the layers when block-major); 0 for a geometry
  /// whose pool does not fit in int64.
  [[nodiscard]] constexpr std::int64_t region_bytes() const noexcept {
    const std::int64_t per_block = block_bytes(rank.geometry, layout == kv_pool_layout::block_major ? num_layers : 1);
    if (per_block <= 0 || rank.geometry.num_blocks <= 0) return 0;
    if (per_block > INT64_MAX / rank.geometry.num_blocks) return 0;
    return per_block * rank.geometry.num_blocks;
  }
  /// Byte offset, in its region, of (layer, block, kv = 0 for K / 1 for V, the rank's head, token in block).
  [[nodiscard]] constexpr std::int64_t offset(std::int32_t layer, block_id b, std::int32_t kv, std::int32_t head,
                                              std::int32_t pos) const noexcept {
    const kv_layout l = kv_layout::of(rank.geometry);
    if (layout == kv_pool_layout::per_layer) return l.offset(b, kv, head, pos);
    return (std::int64_t{b} * num_layers + layer) * l.block_bytes() + l.offset(0, kv, head, pos);
  }
  [[nodiscard]] constexpr std::int32_t region(std::int32_t layer) const noexcept {
    return layout == kv_pool_layout::block_major ? 0 : layer;
  }
};

/// A run of bytes to move: `bytes` from `src_offset` of the sender's region `src_region` to `dst_offset` of the
/// receiver's region `dst_region`.
struct kv_run {
  std::int32_t src_region = 0;
  std::int32_t dst_region = 0;
  std::int64_t src_offset = 0;
  std::int64_t dst_offset = 0;
  std::int64_t bytes = 0;
  friend constexpr bool operator==(const kv_run&, const kv_run&) = default;
};

/// A request's blocks on one side: one block table per KV cache group (a paged_kv_cache: one), each layer's group
/// (empty: every layer in group 0), and the id that marks an entry holding nothing (a window's released blocks, the
/// hybrid cache's null block 0; no_block: none does).
struct kv_tables {
  std::span<const std::span<const block_id>> groups{};
  std::span<const std::int32_t> layer_groups{};
  block_id null_block = no_block;
};

namespace detail {

[[nodiscard]] inline status check_kv_side(const kv_side& s, const char* which) noexcept {
  const kv_geometry& g = s.rank.geometry;
  if (g.block_size <= 0 || g.num_kv_heads <= 0 || g.head_dim <= 0 || g.num_blocks <= 0)
    return status{errc::invalid_argument, which, g.block_size};
  if (s.num_layers <= 0) return status{errc::invalid_argument, which, s.num_layers};
  // Bounds that keep every product below in int32 (a layout may come from a peer's message).
  constexpr std::int32_t most = 4096;
  if (g.num_kv_heads > most || s.rank.tp <= 0 || s.rank.tp > most || s.rank.kv_replicas <= 0 ||
      s.rank.tp % s.rank.kv_replicas != 0 || s.rank.rank < 0 || s.rank.rank >= s.rank.tp)
    return status{errc::invalid_argument, which, s.rank.tp};
  if (s.rank.kv_head_begin < 0 || s.rank.kv_head_begin > most * most ||
      s.rank.kv_head_begin + g.num_kv_heads > s.model_kv_heads())
    return status{errc::invalid_argument, which, s.rank.kv_head_begin};
  if (s.region_bytes() <= 0) return status{errc::invalid_argument, which, g.num_blocks};
  return status{};
}

[[nodiscard]] inline status check_kv_tables(const kv_side& s, const kv_tables& t, std::int64_t num_tokens,
                                            const char* which) noexcept {
  const std::int32_t groups = static_cast<std::int32_t>(t.groups.size());
  if (groups <= 0) return status{errc::invalid_argument, which, groups};
  if (t.layer_groups.empty() ? groups != 1 : static_cast<std::int32_t>(t.layer_groups.size()) != s.num_layers)
    return status{errc::invalid_argument, which, static_cast<std::int64_t>(t.layer_groups.size())};
  for (const std::int32_t g : t.layer_groups)
    if (g < 0 || g >= groups) return status{errc::invalid_argument, which, g};
  const std::int32_t bs = s.rank.geometry.block_size;
  const std::int64_t need = (num_tokens + bs - 1) / bs;
  for (const std::span<const block_id> table : t.groups) {
    if (static_cast<std::int64_t>(table.size()) < need)
      return status{errc::invalid_argument, which, static_cast<std::int64_t>(table.size())};
    for (std::int64_t i = 0; i < need; ++i) {
      const block_id b = table[static_cast<std::size_t>(i)];
      if (b != t.null_block && (b < 0 || b >= s.rank.geometry.num_blocks)) return status{errc::invalid_block, which, b};
    }
  }
  return status{};
}

/// Appends run `r` to `out`, extending the last run when `r` continues it on both sides and is past `floor` (runs
/// before it are the caller's: never changed).
inline void push_run(std::vector<kv_run>& out, const kv_run& r, std::size_t floor) {
  if (out.size() > floor) {
    kv_run& last = out.back();
    if (last.src_region == r.src_region && last.dst_region == r.dst_region &&
        last.src_offset + last.bytes == r.src_offset && last.dst_offset + last.bytes == r.dst_offset) {
      last.bytes += r.bytes;
      return;
    }
  }
  out.push_back(r);
}

}  // namespace detail

/// The sender rank that serves receiver rank `dst` head `head` (a head of the model) among the sender ranks of
/// `src` holding it: its one holder, or, where the sender replicates KV heads over ranks (fewer KV heads than
/// ranks), the replica with the receiver's rank modulo the replicas (so the receivers' reads spread over them).
[[nodiscard]] constexpr std::int32_t serving_rank(const kv_side& src, const kv_side& dst, std::int32_t head) noexcept {
  const std::int32_t rep = src.rank.kv_replicas;
  if (rep > 1) return head * rep + dst.rank.rank % rep;
  return head / src.rank.geometry.num_kv_heads;
}

/// Plans the runs that move tokens [first_token, first_token + num_tokens) of a request's KV from sender rank `src` (the request's
/// blocks `src_tables`) into receiver rank `dst` (its blocks `dst_tables`): every layer, K and V, and each KV head
/// the receiver holds that `src` is the serving rank of (serving_rank: over all sender ranks, each head the receiver
/// needs comes from exactly one). Token t of a layer lies in block t / block_size of its group's table, at
/// t % block_size, on each side. Entries of the receiver's tables that are its null block are skipped (nothing to
/// receive there); runs are appended to `out` in the receiver's memory order and merged where they continue each
/// other on both sides (equal layouts and consecutive blocks make one run per layer, or one in all for block-major
/// pools).
/// Errors, with `out` as it was: errc::invalid_argument for a side that is not a valid layout, the two sides
/// describing different models (head size, element type, layers, KV heads of the model), tables that do not match
/// their side (group count, a layer's group, fewer entries than num_tokens needs), a negative num_tokens, or a
/// token the receiver keeps that the sender no longer holds (its entry is the sender's null block);
/// errc::invalid_block for an entry outside its side's pool.
inline status plan_kv_runs(const kv_side& src, const kv_tables& src_tables, const kv_side& dst,
                           const kv_tables& dst_tables, std::int64_t first_token, std::int64_t num_tokens,
                           std::vector<kv_run>& out) {
  if (const status st = detail::check_kv_side(src, "plan_kv_runs: the sender's layout is not valid"); !st.ok())
    return st;
  if (const status st = detail::check_kv_side(dst, "plan_kv_runs: the receiver's layout is not valid"); !st.ok())
    return st;
  const kv_geometry& sg = src.rank.geometry;
  const kv_geometry& dg = dst.rank.geometry;
  if (sg.head_dim != dg.head_dim)
    return status{errc::invalid_argument, "plan_kv_runs: the two sides' head sizes differ", dg.head_dim};
  if (sg.dtype != dg.dtype)
    return status{errc::invalid_argument, "plan_kv_runs: the two sides' KV element types differ",
                  static_cast<std::int64_t>(dg.dtype)};
  if (src.num_layers != dst.num_layers)
    return status{errc::invalid_argument, "plan_kv_runs: the two sides' layer counts differ", dst.num_layers};
  if (src.model_kv_heads() != dst.model_kv_heads())
    return status{errc::invalid_argument, "plan_kv_runs: the two sides' models have different KV head counts",
                  dst.model_kv_heads()};
  if (num_tokens < 0) return status{errc::invalid_argument, "plan_kv_runs: num_tokens must not be negative", num_tokens};
  if (first_token < 0 || first_token > INT64_MAX - num_tokens)
    return status{errc::invalid_argument, "plan_kv_runs: first_token must not be negative", first_token};
  const std::int64_t end_token = first_token + num_tokens;
  if (const status st = detail::check_kv_tables(src, src_tables, end_token,
                                                "plan_kv_runs: the sender's tables do not match its layout");
      !st.ok())
    return st;
  if (const status st = detail::check_kv_tables(dst, dst_tables, end_token,
                                                "plan_kv_runs: the receiver's tables do not match its layout");
      !st.ok())
    return st;
  if (src_tables.groups.size() != dst_tables.groups.size())
    return status{errc::invalid_argument, "plan_kv_runs: the two sides have different KV cache group counts",
                  static_cast<std::int64_t>(dst_tables.groups.size())};
  const auto group_of = [](const kv_tables& t, std::int32_t layer) {
    return t.layer_groups.empty() ? 0 : t.layer_groups[static_cast<std::size_t>(layer)];
  };
  for (std::int32_t l = 0; l < src.num_layers; ++l)
    if (group_of(src_tables, l) != group_of(dst_tables, l))
      return status{errc::invalid_argument, "plan_kv_runs: a layer is in different KV cache groups on the two sides", l};

  const std::int32_t sbs = sg.block_size;
  const std::int32_t dbs = dg.block_size;
  const std::int64_t row = kv_layout::of(dg).row_bytes();
  const std::size_t old_size = out.size();
  const std::int64_t first_entry = first_token / dbs;
  const std::int64_t dst_entries = num_tokens == 0 ? 0 : (end_token + dbs - 1) / dbs - first_entry;
  // The receiver's memory order: per-layer pools layer by layer, then block by block; block-major pools block by
  // block, then layer by layer. Within a block: K then V, head by head, token by token.
  const bool block_major = dst.layout == kv_pool_layout::block_major;
  // Equal block sizes and the same heads on both sides, all served from `src`: a whole block (K and V, every head)
  // is one run, planned without walking its heads.
  bool same_shape = sbs == dbs && sg.num_kv_heads == dg.num_kv_heads && src.rank.kv_head_begin == dst.rank.kv_head_begin;
  for (std::int32_t h = 0; same_shape && h < dg.num_kv_heads; ++h)
    same_shape = serving_rank(src, dst, dst.rank.kv_head_begin + h) == src.rank.rank;
  const std::int64_t whole_block = 2 * std::int64_t{dg.num_kv_heads} * dbs * row;
  const std::int64_t outer = block_major ? dst_entries : dst.num_layers;
  const std::int64_t inner = block_major ? dst.num_layers : dst_entries;
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      const std::int32_t layer = static_cast<std::int32_t>(block_major ? i : o);
      const std::int64_t j = first_entry + (block_major ? o : i);  // the receiver's table entry
      const std::int32_t g = group_of(dst_tables, layer);
      const std::span<const block_id> st = src_tables.groups[static_cast<std::size_t>(g)];
      const block_id db = dst_tables.groups[static_cast<std::size_t>(g)][static_cast<std::size_t>(j)];
      if (db == dst_tables.null_block) continue;
      const std::int64_t first = j * dbs > first_token ? j * dbs : first_token;
      const std::int64_t last = (j + 1) * dbs < end_token ? (j + 1) * dbs : end_token;
      if (same_shape && first == j * dbs && last == (j + 1) * dbs) {
        const block_id sb = st[static_cast<std::size_t>(j)];
        if (sb == src_tables.null_block) {
          out.resize(old_size);
          return status{errc::invalid_argument,
                        "plan_kv_runs: the receiver keeps a token the sender no longer holds (a released block)", first};
        }
        detail::push_run(out, kv_run{src.region(layer), dst.region(layer), src.offset(layer, sb, 0, 0, 0),
                                     dst.offset(layer, db, 0, 0, 0), whole_block},
                          old_size);
        continue;
      }
      for (std::int32_t kv = 0; kv < 2; ++kv) {
        for (std::int32_t hd = 0; hd < dg.num_kv_heads; ++hd) {
          const std::int32_t head = dst.rank.kv_head_begin + hd;
          if (head < src.rank.kv_head_begin || head >= src.rank.kv_head_begin + sg.num_kv_heads) continue;
          if (serving_rank(src, dst, head) != src.rank.rank) continue;
          const std::int32_t hs = head - src.rank.kv_head_begin;
          for (std::int64_t t = first; t < last;) {
            const block_id sb = st[static_cast<std::size_t>(t / sbs)];
            const std::int64_t in_src = sbs - t % sbs;
            const std::int64_t seg = in_src < last - t ? in_src : last - t;
            if (sb == src_tables.null_block) {
              out.resize(old_size);
              return status{errc::invalid_argument,
                            "plan_kv_runs: the receiver keeps a token the sender no longer holds (a released block)", t};
            }
            detail::push_run(out, kv_run{src.region(layer), dst.region(layer),
                                         src.offset(layer, sb, kv, hs, static_cast<std::int32_t>(t % sbs)),
                                         dst.offset(layer, db, kv, hd, static_cast<std::int32_t>(t % dbs)), seg * row},
                            old_size);
            t += seg;
          }
        }
      }
    }
  }
  return status{};
}

/// plan_kv_runs of the request's first `num_tokens` tokens.
inline status plan_kv_runs(const kv_side& src, const kv_tables& src_tables, const kv_side& dst,
                           const kv_tables& dst_tables, std::int64_t num_tokens, std::vector<kv_run>& out) {
  return plan_kv_runs(src, src_tables, dst, dst_tables, 0, num_tokens, out);
}

/// plan_kv_runs for a request with one block table a side (a paged_kv_cache's), tokens [first_token, first_token +
/// num_tokens).
inline status plan_kv_runs(const kv_side& src, std::span<const block_id> src_table, const kv_side& dst,
                           std::span<const block_id> dst_table, std::int64_t first_token, std::int64_t num_tokens,
                           std::vector<kv_run>& out) {
  const std::span<const block_id> s[1] = {src_table};
  const std::span<const block_id> d[1] = {dst_table};
  return plan_kv_runs(src, kv_tables{s}, dst, kv_tables{d}, first_token, num_tokens, out);
}

/// plan_kv_runs for a request with one block table a side, its first `num_tokens` tokens.
inline status plan_kv_runs(const kv_side& src, std::span<const block_id> src_table, const kv_side& dst,
                           std::span<const block_id> dst_table, std::int64_t num_tokens, std::vector<kv_run>& out) {
  return plan_kv_runs(src, src_table, dst, dst_table, 0, num_tokens, out);
}

/// Total bytes of `runs`.
[[nodiscard]] inline std::int64_t run_bytes(std::span<const kv_run> runs) noexcept {
  std::int64_t n = 0;
  for (const kv_run& r : runs) n += r.bytes;
  return n;
}

KVPAGER_NAMESPACE_END
