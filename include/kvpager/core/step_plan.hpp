// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// step_plan: the byte movement one scheduler step needs, recorded by the cache and carried out by the engine
/// (the cache never touches KV bytes). Execution order for an executor: (1) all `swap_outs` (device to host),
/// (2) all `swap_ins` (host to device), (3) all `copies` (they read content that is complete as of the start of
/// the step), then (4) the KV writes of the appended tokens through the slot mapping
/// (paged_kv_cache::export_slot_mapping), then attention. The cache only plans steps for which this order is
/// correct: it refuses to fork or swap out a sequence whose bytes for this step are not in place yet, and it does
/// not hand out a block that a planned copy still reads or writes until the next step begins.

#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/span_of.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Copy one whole block (all layers, K and V): copy-on-write or a copying fork.
struct block_copy {
  block_id src = no_block;
  block_id dst = no_block;
  std::int32_t group = 0;  ///< the KV cache group whose layers are copied (hybrid_kv_cache; 0 for one group)
  friend bool operator==(const block_copy&, const block_copy&) = default;
};

/// Move one whole block (all layers, K and V) between the device pool and the host (swap) pool.
struct block_swap {
  block_id device = no_block;
  block_id host = no_block;
  std::int32_t group = 0;  ///< the KV cache group whose layers move (0 for one group)
  friend bool operator==(const block_swap&, const block_swap&) = default;
};

/// Tokens [first_pos, first_pos + count) of sequence `seq` were appended in this step and need their K/V written.
struct token_range {
  seq_id seq = 0;
  std::int32_t first_pos = 0;
  std::int32_t count = 0;
  friend bool operator==(const token_range&, const token_range&) = default;
};

/// A plain value type; the cache appends to it during a step and clears it in begin_step().
class step_plan {
 public:
  /// Block copies, in the order they were planned. No block is both a source and a destination within a step,
  /// and no destination appears twice, so an executor may run them in parallel.
  [[nodiscard]] std::span<const block_copy> copies() const noexcept { return detail::span_of(copies_); }
  /// Device blocks to copy to host blocks (swap-out), executed first.
  [[nodiscard]] std::span<const block_swap> swap_outs() const noexcept { return detail::span_of(swap_outs_); }
  /// Host blocks to copy to device blocks (swap-in), executed after the swap-outs.
  [[nodiscard]] std::span<const block_swap> swap_ins() const noexcept { return detail::span_of(swap_ins_); }
  /// Appended token ranges in the order of the calls; their slots are exported by the cache in this order.
  [[nodiscard]] std::span<const token_range> appends() const noexcept { return detail::span_of(appends_); }
  /// Total tokens over all appended ranges (the length of the slot mapping).
  [[nodiscard]] std::int64_t num_append_tokens() const noexcept { return num_tokens_; }
  [[nodiscard]] bool empty() const noexcept {
    return copies_.empty() && appends_.empty() && swap_outs_.empty() && swap_ins_.empty();
  }

  void add_copy(block_copy c) { copies_.push_back(c); }
  void add_swap_out(block_swap s) { swap_outs_.push_back(s); }
  void add_swap_in(block_swap s) { swap_ins_.push_back(s); }
  void add_append(token_range r) {
    appends_.push_back(r);
    num_tokens_ += r.count;
  }
  void clear() noexcept {
    swap_outs_.clear();
    swap_ins_.clear();
    copies_.clear();
    appends_.clear();
    num_tokens_ = 0;
  }

 private:
  std::vector<block_swap> swap_outs_;
  std::vector<block_swap> swap_ins_;
  std::vector<block_copy> copies_;
  std::vector<token_range> appends_;
  std::int64_t num_tokens_ = 0;
};

KVPAGER_NAMESPACE_END
