// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// request_table: the requests a scheduler holds, in dense slots reached by id through an id_map. The scheduler's
/// running queue keeps each request's slot beside its id, so a step walks its requests without a hash lookup. A
/// finished request's slot (and its token buffer's capacity) is reused by the next request added.

#include <cstdint>
#include <utility>
#include <vector>

#include "kvpager/cache/paged_kv_cache.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/id_map.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/sched/step_output.hpp"

KVPAGER_NAMESPACE_BEGIN

/// One request a scheduler holds.
struct sched_request {
  std::vector<token_id> tokens;  ///< prompt, then every sampled token
  /// Chained hashes of its leading cached full blocks, saved when it is preempted: its re-admission after a
  /// recompute hashes none of them again (paged_kv_cache::block_hashes).
  std::vector<std::uint64_t> block_hashes;
  seq_id id = 0;
  std::int32_t computed = 0;     ///< tokens with KV in the cache
  std::int32_t prompt_len = 0;   ///< tokens of its prompt (the rest were sampled)
  sequence_options options;      ///< extra key and priority, given to the cache at every admission
  std::int64_t aged = 0;         ///< priority gained while waiting (64 bits: priority + aged never overflows)
  std::int32_t waited = 0;       ///< steps waited since the last aging increment
  request_state where = request_state::unknown;  ///< unknown: a free slot
  bool prefilling = false;       ///< its tokens up to tokens.size() are a prompt (or a recompute) being computed
  bool preempted = false;        ///< preempted at least once (its admissions count in resumed_prefix)
  bool hold = false;             ///< its sequence is kept when it finishes running (scheduler::hold)
  std::uint64_t step = 0;        ///< last step in which it was scheduled

  [[nodiscard]] std::int64_t num_tokens() const noexcept { return static_cast<std::int64_t>(tokens.size()); }
  /// Priority plus aging.
  [[nodiscard]] std::int64_t effective_priority() const noexcept { return std::int64_t{options.priority} + aged; }
};

/// Requests by id, in reusable dense slots. Lookups never allocate; add allocates only when the table grows past
/// every size it had (and for a prompt longer than the reused slot's buffer).
/// A template only so that a translation unit that does not use it analyses none of its members (and none of the
/// standard templates they use): see basic_scheduler_queues in sched/scheduler_queues.hpp.
template <class = void>
class basic_request_table {
 public:
  using slot_type = std::int32_t;

  /// The slot of request `id`, or -1.
  [[nodiscard]] slot_type find(seq_id id) const noexcept { return index_.find(id); }
  [[nodiscard]] bool contains(seq_id id) const noexcept { return find(id) >= 0; }
  /// Request `id`, or nullptr.
  [[nodiscard]] sched_request* get(seq_id id) noexcept {
    const slot_type s = find(id);
    return s < 0 ? nullptr : &slots_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] const sched_request* get(seq_id id) const noexcept {
    const slot_type s = find(id);
    return s < 0 ? nullptr : &slots_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] sched_request& operator[](slot_type s) noexcept { return slots_[static_cast<std::size_t>(s)]; }
  [[nodiscard]] const sched_request& operator[](slot_type s) const noexcept {
    return slots_[static_cast<std::size_t>(s)];
  }
  /// The request of a slot that find() returned (the id must be present).
  [[nodiscard]] sched_request& at_id(seq_id id) noexcept { return (*this)[find(id)]; }

  /// Adds request `id` (not present) as a waiting request with no tokens; returns its slot. References to other
  /// requests are invalidated when the table grows.
  slot_type add(seq_id id) {
    slot_type s;
    if (!free_.empty()) {
      s = free_.back();
      free_.pop_back();
    } else {
      s = static_cast<slot_type>(slots_.size());
      slots_.emplace_back();
      free_.reserve(slots_.size());  // so that erase never allocates
    }
    index_.insert(id, s);
    sched_request& r = (*this)[s];
    std::vector<token_id> buffer = std::move(r.tokens);  // keep its capacity
    buffer.clear();
    r = sched_request{};
    r.tokens = std::move(buffer);
    r.id = id;
    r.where = request_state::waiting;
    return s;
  }

  /// Removes request `id` (present); its slot is marked free (where == unknown).
  void erase(seq_id id) noexcept {
    const slot_type s = find(id);
    (*this)[s].where = request_state::unknown;
    (void)index_.erase(id);
    free_.push_back(s);
  }

 private:
  std::vector<sched_request> slots_;
  std::vector<slot_type> free_;
  id_map index_;
};

using request_table = basic_request_table<>;

KVPAGER_NAMESPACE_END
