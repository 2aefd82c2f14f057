#pragma once
/// \file
/// step_plan: the byte movement one scheduler step needs, recorded by the cache and carried out by the engine
/// (the cache never touches KV bytes). Execution order for an executor: (1) all `copies` (they read content that
/// is complete as of the start of the step), then (2) the KV writes of the appended tokens through the slot
/// mapping (paged_kv_cache::export_slot_mapping), then attention. The cache only plans steps for which this
/// order is correct: it refuses to fork a sequence whose appended tokens are not written yet, and it does not
/// hand out a block that a planned copy still reads or writes until the next step begins.

#include <cstdint>
#include <span>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Copy one whole block (all layers, K and V): copy-on-write or a copying fork.
struct block_copy {
  block_id src = no_block;
  block_id dst = no_block;
  friend bool operator==(const block_copy&, const block_copy&) = default;
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
  [[nodiscard]] std::span<const block_copy> copies() const noexcept { return copies_; }
  /// Appended token ranges in the order of the calls; their slots are exported by the cache in this order.
  [[nodiscard]] std::span<const token_range> appends() const noexcept { return appends_; }
  /// Total tokens over all appended ranges (the length of the slot mapping).
  [[nodiscard]] std::int64_t num_append_tokens() const noexcept { return num_tokens_; }
  [[nodiscard]] bool empty() const noexcept { return copies_.empty() && appends_.empty(); }

  void add_copy(block_copy c) { copies_.push_back(c); }
  void add_append(token_range r) {
    appends_.push_back(r);
    num_tokens_ += r.count;
  }
  void clear() noexcept {
    copies_.clear();
    appends_.clear();
    num_tokens_ = 0;
  }

 private:
  std::vector<block_copy> copies_;
  std::vector<token_range> appends_;
  std::int64_t num_tokens_ = 0;
};

KVPAGER_NAMESPACE_END
