// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Tensor parallelism over attention heads: which KV heads and query heads each of `tp` ranks owns, and the
/// geometry of its KV pool. Every rank follows the decisions of one cache (the same block ids, block tables, slot
/// mapping and step plans); only the heads differ, so a rank's pool has the cache's block count and block size and
/// its own share of the KV heads.
///
/// The split is vLLM's (QKVParallelLinear, ModelConfig::get_num_kv_heads): query heads are divided evenly
/// (num_q_heads % tp == 0); KV heads are divided evenly when num_kv_heads >= tp (num_kv_heads % tp == 0), otherwise
/// each rank holds one KV head, replicated on tp / num_kv_heads consecutive ranks (tp % num_kv_heads == 0). So a
/// rank holds max(1, num_kv_heads / tp) KV heads, and rank r's query heads [r * q/tp, (r+1) * q/tp) use exactly the
/// KV heads the unsplit model gives them. Pure arithmetic; never throws, allocates nothing.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "kvpager/core/config.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// How `num_q_heads` query heads and `num_kv_heads` KV heads are split over `tp` ranks.
struct tp_head_split {
  std::int32_t tp = 1;                 ///< ranks
  std::int32_t q_heads_per_rank = 1;   ///< num_q_heads / tp
  std::int32_t kv_heads_per_rank = 1;  ///< max(1, num_kv_heads / tp)
  std::int32_t kv_replicas = 1;        ///< ranks holding each KV head: tp / num_kv_heads when num_kv_heads < tp, else 1

  friend constexpr bool operator==(const tp_head_split&, const tp_head_split&) = default;
};

/// The head split of a model with `num_q_heads` query and `num_kv_heads` KV heads over `tp` ranks. Errors
/// (errc::invalid_argument, detail = the offending value): tp <= 0; num_q_heads or num_kv_heads <= 0; num_q_heads
/// not a multiple of num_kv_heads (no GQA grouping); num_q_heads not divisible by tp; num_kv_heads >= tp but not
/// divisible by tp; num_kv_heads < tp but tp not a multiple of num_kv_heads (replication would be uneven).
[[nodiscard]] constexpr result<tp_head_split> split_heads(std::int32_t num_q_heads, std::int32_t num_kv_heads,
                                                          std::int32_t tp) noexcept {
  if (tp <= 0) return status{errc::invalid_argument, "split_heads: tensor-parallel degree must be positive", tp};
  if (num_kv_heads <= 0) return status{errc::invalid_argument, "split_heads: num_kv_heads must be positive", num_kv_heads};
  if (num_q_heads <= 0) return status{errc::invalid_argument, "split_heads: num_q_heads must be positive", num_q_heads};
  if (num_q_heads % num_kv_heads != 0)
    return status{errc::invalid_argument, "split_heads: num_q_heads must be a multiple of num_kv_heads", num_q_heads};
  if (num_q_heads % tp != 0)
    return status{errc::invalid_argument, "split_heads: num_q_heads must be divisible by the tensor-parallel degree", tp};
  if (num_kv_heads >= tp) {
    if (num_kv_heads % tp != 0)
      return status{errc::invalid_argument,
                    "split_heads: num_kv_heads >= tp must be divisible by the tensor-parallel degree", tp};
    return tp_head_split{tp, num_q_heads / tp, num_kv_heads / tp, 1};
  }
  if (tp % num_kv_heads != 0)
    return status{errc::invalid_argument,
                  "split_heads: with num_kv_heads < tp, tp must be a multiple of num_kv_heads (even replication)", tp};
  return tp_head_split{tp, num_q_heads / tp, 1, tp / num_kv_heads};
}

/// What one rank owns: its query heads [q_head_begin, q_head_begin + num_q_heads) and KV heads [kv_head_begin,
/// kv_head_begin + geometry.num_kv_heads) of the unsplit model, and the geometry of its KV pool (the cache's blocks,
/// block size, head dim and dtype; its own KV head count).
struct tp_rank_layout {
  std::int32_t rank = 0;
  std::int32_t tp = 1;
  kv_geometry geometry{};          ///< this rank's pool: num_kv_heads = its KV heads
  std::int32_t kv_head_begin = 0;  ///< first KV head of the unsplit model held here
  std::int32_t q_head_begin = 0;   ///< first query head of the unsplit model computed here
  std::int32_t num_q_heads = 1;    ///< query heads computed here
  std::int32_t kv_replicas = 1;    ///< ranks holding the same KV heads (> 1 only when num_kv_heads < tp)

  /// Query heads per KV head on this rank (the decode kernel's GQA group size for this rank's call).
  [[nodiscard]] constexpr std::int32_t group_size() const noexcept { return num_q_heads / geometry.num_kv_heads; }

  friend constexpr bool operator==(const tp_rank_layout&, const tp_rank_layout&) = default;
};

/// Rank `rank`'s share of a pool of geometry `g` (all KV heads of the model) for a model with `num_q_heads` query
/// heads under tensor-parallel degree `tp`. Errors: those of split_heads(num_q_heads, g.num_kv_heads, tp), and
/// errc::invalid_argument for a rank outside [0, tp).
[[nodiscard]] constexpr result<tp_rank_layout> rank_layout(const kv_geometry& g, std::int32_t num_q_heads, std::int32_t tp,
                                                           std::int32_t rank) noexcept {
  const result<tp_head_split> s = split_heads(num_q_heads, g.num_kv_heads, tp);
  if (!s.ok()) return s.error();
  if (rank < 0 || rank >= tp) return status{errc::invalid_argument, "rank_layout: rank must be in [0, tp)", rank};
  // split_heads succeeded, so re-deriving its (checked) numbers here is safe and keeps this function constexpr
  // (result::value() is not).
  const std::int32_t kv_per_rank = g.num_kv_heads >= tp ? g.num_kv_heads / tp : 1;
  const std::int32_t replicas = g.num_kv_heads >= tp ? 1 : tp / g.num_kv_heads;
  const std::int32_t q_per_rank = num_q_heads / tp;
  kv_geometry rg = g;
  rg.num_kv_heads = kv_per_rank;
  // With replication, ranks [k * replicas, (k + 1) * replicas) hold KV head k.
  const std::int32_t kv_begin = replicas > 1 ? rank / replicas : rank * kv_per_rank;
  return tp_rank_layout{rank, tp, rg, kv_begin, rank * q_per_rank, q_per_rank, replicas};
}

/// Copies heads [begin, begin + count) of `num_rows` rows of `total_heads` heads each ([num_rows, total_heads,
/// row_bytes] in `src`, row-major, as a QKV projection produces K, V or Q) into `dst` ([num_rows, count, row_bytes]).
/// Errors: errc::invalid_argument (num_rows < 0, row_bytes <= 0, or the range outside [0, total_heads)),
/// errc::buffer_too_small (`src` or `dst` shorter than needed; detail = bytes needed); nothing written then.
inline status copy_head_slice(std::int32_t total_heads, std::int32_t begin, std::int32_t count, std::int64_t row_bytes,
                              std::int64_t num_rows, std::span<const std::byte> src, std::span<std::byte> dst) noexcept {
  if (num_rows < 0) return status{errc::invalid_argument, "copy_head_slice: num_rows must not be negative", num_rows};
  if (row_bytes <= 0) return status{errc::invalid_argument, "copy_head_slice: row_bytes must be positive", row_bytes};
  if (begin < 0 || count <= 0 || total_heads <= 0 || std::int64_t{begin} + count > total_heads)
    return status{errc::invalid_argument, "copy_head_slice: the head range is outside [0, total_heads)", begin};
  const std::int64_t need_src = num_rows * total_heads * row_bytes;
  const std::int64_t need_dst = num_rows * count * row_bytes;
  if (static_cast<std::int64_t>(src.size()) < need_src)
    return status{errc::buffer_too_small, "copy_head_slice: src is shorter than num_rows x total_heads heads", need_src};
  if (static_cast<std::int64_t>(dst.size()) < need_dst)
    return status{errc::buffer_too_small, "copy_head_slice: dst is shorter than num_rows x count heads", need_dst};
  const auto run = static_cast<std::size_t>(count * row_bytes);  // the range is consecutive within a row
  for (std::int64_t t = 0; t < num_rows; ++t)
    std::memcpy(dst.data() + static_cast<std::size_t>(t * count * row_bytes),
                src.data() + static_cast<std::size_t>((t * total_heads + begin) * row_bytes), run);
  return ok_status();
}

/// Rank `r`'s KV heads of `num_tokens` tokens' K (or V) for all `full_kv_heads` KV heads of the model, in the
/// shape its executor takes ([num_tokens, r.geometry.num_kv_heads, head_dim]). For tests and engines that project
/// all heads in one place; a real TP engine's rank computes only its own heads. Errors as copy_head_slice.
inline status copy_rank_kv_heads(const tp_rank_layout& r, std::int32_t full_kv_heads, std::int64_t num_tokens,
                                 std::span<const std::byte> full, std::span<std::byte> shard) noexcept {
  return copy_head_slice(full_kv_heads, r.kv_head_begin, r.geometry.num_kv_heads,
                         std::int64_t{r.geometry.head_dim} * elem_bytes(r.geometry.dtype), num_tokens, full, shard);
}

/// Rank `r`'s query heads of `num_seqs` decode queries for all `full_q_heads` query heads ([num_seqs, full_q_heads,
/// head_dim] -> [num_seqs, r.num_q_heads, head_dim]); the same slicing gives back a rank's place in the
/// concatenated output. Errors as copy_head_slice.
inline status copy_rank_q_heads(const tp_rank_layout& r, std::int32_t full_q_heads, std::int64_t num_seqs,
                                std::span<const std::byte> full, std::span<std::byte> shard) noexcept {
  return copy_head_slice(full_q_heads, r.q_head_begin, r.num_q_heads,
                         std::int64_t{r.geometry.head_dim} * elem_bytes(r.geometry.dtype), num_seqs, full, shard);
}

KVPAGER_NAMESPACE_END
