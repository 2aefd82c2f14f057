// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// external_book: the sequences of a cache that wait for KV from outside (sequence_options::external_tokens), shared
/// by paged_kv_cache and hybrid_kv_cache. A sequence admitted with external KV is recorded here with its table
/// range (the same entries in every table), the tokens those entries hold (committed when they arrive) and its
/// state: loading until the engine reports the read (complete_external), failed if it did not arrive. A sequence
/// freed while its read may still write keeps its external blocks here (orphans) until the read is reported. The
/// cache supplies what differs: whether the id is live, how a block is released and how the arrived blocks are
/// committed.

#include <cstddef>
#include <utility>
#include <vector>

#include "kvpager/cache/cache_types.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN
namespace detail {

/// One sequence admitted with external KV, until its read is reported.
struct external_wait {
  seq_id id = 0;
  external_range range{};
  std::vector<token_id> tokens;  ///< the tokens of table entries [0, range.first + range.count)
  tier_load_state state = tier_load_state::loading;
  /// Freed while its read could still be writing: its external blocks, held until complete_external reports it.
  std::vector<block_id> orphans;
};

class external_book {
 public:
  [[nodiscard]] const external_wait* find(seq_id id) const noexcept {
    for (const external_wait& w : waits_)
      if (w.id == id) return &w;
    return nullptr;
  }
  [[nodiscard]] external_wait* find(seq_id id) noexcept {
    for (external_wait& w : waits_)
      if (w.id == id) return &w;
    return nullptr;
  }
  /// A read in flight for sequence `id` (its blocks must not be freed yet), or nullptr.
  [[nodiscard]] external_wait* reading(seq_id id) noexcept {
    external_wait* w = find(id);
    return w != nullptr && w->state == tier_load_state::loading ? w : nullptr;
  }
  [[nodiscard]] bool empty() const noexcept { return waits_.empty(); }

  /// Room for one more record (called before an admission changes anything).
  void reserve_one() { waits_.reserve(waits_.size() + 1); }
  void add(seq_id id, external_range range, std::vector<token_id>&& tokens) {
    external_wait& w = waits_.emplace_back();
    w.id = id;
    w.range = range;
    w.tokens = std::move(tokens);
  }
  void erase(seq_id id) noexcept {
    for (std::size_t i = 0; i < waits_.size(); ++i)
      if (waits_[i].id == id) {
        waits_[i] = std::move(waits_.back());
        waits_.pop_back();
        return;
      }
  }

  /// The cache's external_blocks(id); `live`: whether the id is a live sequence.
  [[nodiscard]] result<external_range> range(seq_id id, bool live) const noexcept {
    if (!live) return status{errc::unknown_sequence, "external_blocks: unknown sequence id"};
    const external_wait* w = find(id);
    if (w == nullptr || w->state != tier_load_state::loading)
      return status{errc::invalid_argument, "external_blocks: the sequence waits for no external KV"};
    return w->range;
  }

  /// The cache's complete_external(id, ok): a freed sequence's orphans are released (`release(b)`); a live one's
  /// arrived blocks are committed (`commit(w)`) and its record dropped, or its state set to failed.
  template <class Release, class Commit>
  status complete(seq_id id, bool ok, bool live, Release&& release, Commit&& commit) {
    if (external_wait* o = find(id); o != nullptr && !o->orphans.empty()) {  // freed while reading
      for (const block_id b : o->orphans) release(b);
      erase(id);
      return ok_status();
    }
    if (!live) return status{errc::unknown_sequence, "complete_external: unknown sequence id"};
    external_wait* w = find(id);
    if (w == nullptr || w->state != tier_load_state::loading)
      return status{errc::invalid_argument, "complete_external: the sequence waits for no external KV"};
    if (!ok) {
      w->state = tier_load_state::failed;
      return ok_status();
    }
    commit(*w);
    erase(id);
    return ok_status();
  }

 private:
  std::vector<external_wait> waits_;
};

}  // namespace detail
KVPAGER_NAMESPACE_END
