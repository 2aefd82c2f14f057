// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// scheduler_queues: the state a scheduler keeps about its requests, apart from any cache: the request table, the
/// waiting, running and swapped queues, pending forks, the counters, and the queue orders (FCFS or priority with
/// aging, and the victim choice). scheduler<Cache> derives from it and adds the step; the read accessors here are its public
/// view of the queues.

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/span_of.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/sched/request_queue.hpp"
#include "kvpager/sched/request_table.hpp"
#include "kvpager/sched/scheduler_config.hpp"
#include "kvpager/sched/step_output.hpp"

KVPAGER_NAMESPACE_BEGIN

/// The requests of a scheduler and its queues.
/// A class template with one defaulted parameter, used as scheduler_queues: its member functions (and the standard
/// algorithms they instantiate) are analysed only in a translation unit that uses them, not in every one that
/// includes <kvpager/kvpager.hpp> (a consumer build cost measured in bench/RESULTS.md).
template <class = void>
class basic_scheduler_queues {
 public:
  /// Running requests, oldest admission first (the newest is the newest_first victim).
  [[nodiscard]] std::span<const seq_id> running() const noexcept { return detail::span_of(running_); }
  /// Waiting requests in admission order (recompute victims in front).
  [[nodiscard]] const request_queue& waiting() const noexcept { return waiting_; }
  /// Swapped-out requests, oldest first (the order they are swapped back in).
  [[nodiscard]] const request_queue& swapped() const noexcept { return swapped_; }
  /// Requests waiting for host tier loads (async transfers), in admission order.
  [[nodiscard]] std::span<const seq_id> loading() const noexcept { return detail::span_of(loading_); }
  /// Where request `id` is; request_state::unknown for an id that is not a request (a pending fork child is not
  /// one yet).
  [[nodiscard]] request_state state(seq_id id) const noexcept {
    const sched_request* r = reqs_.get(id);
    return r == nullptr ? request_state::unknown : r->where;
  }
  /// Fork children requested and not yet created (parent, child), in request order.
  [[nodiscard]] std::span<const std::pair<seq_id, seq_id>> pending_forks() const noexcept {
    return detail::span_of(forks_);
  }
  /// Token ids of request `id` (prompt, then sampled tokens), or an empty span.
  [[nodiscard]] std::span<const token_id> tokens(seq_id id) const noexcept {
    const sched_request* r = reqs_.get(id);
    return r == nullptr ? std::span<const token_id>{} : detail::span_of(r->tokens);
  }
  /// Tokens of request `id` whose KV is in the cache (running or swapped; equal to the cache's num_tokens), 0 for
  /// a waiting or unknown request.
  [[nodiscard]] std::int32_t num_computed_tokens(seq_id id) const noexcept {
    const sched_request* r = reqs_.get(id);
    return r == nullptr ? 0 : r->computed;
  }
  /// Effective priority of request `id`: its priority plus aging, saturated to the int32 range (0 if unknown).
  [[nodiscard]] std::int32_t priority(seq_id id) const noexcept {
    const sched_request* r = reqs_.get(id);
    if (r == nullptr) return 0;
    return static_cast<std::int32_t>(std::min<std::int64_t>(r->effective_priority(), INT32_MAX));
  }

  /// The counters, with the queue sizes now.
  [[nodiscard]] scheduler_stats stats() const noexcept {
    scheduler_stats s = stats_;
    s.waiting = static_cast<std::int32_t>(waiting_.size());
    s.running = static_cast<std::int32_t>(running_.size());
    s.swapped = static_cast<std::int32_t>(swapped_.size());
    s.loading = static_cast<std::int32_t>(loading_.size());
    return s;
  }

 protected:
  using slot_type = request_table::slot_type;
  /// complete() without `finished` for request `r` (nullptr: unknown).
  status take_token(sched_request* r, token_id next) {
    if (r == nullptr) return status{errc::unknown_sequence, "complete: unknown request id"};
    if (r->where != request_state::running || r->computed != r->num_tokens())
      return status{errc::invalid_argument,
                    "complete: the request is not waiting for a token (a prefill chunk that is not the last, a "
                    "waiting or swapped request, or a token already given)"};
    r->tokens.push_back(next);
    return ok_status();
  }

  /// Request `r`, no longer in the cache, waits again at the front to be computed anew (a recompute victim, or a
  /// request whose host tier loads failed); its next admission counts as a resumed one.
  void requeue(sched_request& r) {
    r.preempted = true;
    r.where = request_state::waiting;
    r.computed = 0;
    r.prefilling = false;
    waiting_.push_front(r.id);
  }

  /// Takes request `r` off whichever queue holds it (running, swapped or waiting).
  void leave_queue(const sched_request& r) {
    switch (r.where) {
      case request_state::running:
        erase_running(r.id);
        break;
      case request_state::swapped:
        (void)swapped_.erase(r.id);
        break;
      case request_state::loading:
        if (const auto it = std::find(loading_.begin(), loading_.end(), r.id); it != loading_.end()) loading_.erase(it);
        break;
      default:
        (void)waiting_.erase(r.id);
        break;
    }
  }


  [[nodiscard]] bool known(seq_id id) const noexcept {
    return reqs_.contains(id) ||
           std::any_of(forks_.begin(), forks_.end(), [&](const auto& f) { return f.second == id; });
  }

  /// The victim for a shortage of running request `self`: among the running requests not scheduled in this step,
  /// scheduled in step `step` (and `self`), the newest, or the lowest effective priority (newest among equals).
  [[nodiscard]] seq_id pick_victim(seq_id self, std::uint64_t step, preemption_order order) const {
    seq_id best = self;
    bool found = false;
    std::int64_t best_priority = 0;
    for (std::size_t i = running_.size(); i-- > 0;) {  // newest first
      const sched_request& c = reqs_[running_slots_[i]];
      if (c.id != self && c.step == step) continue;
      if (order == preemption_order::newest_first) return c.id;
      if (!found || c.effective_priority() < best_priority) {
        best = c.id;
        best_priority = c.effective_priority();
        found = true;
      }
    }
    return best;
  }

  /// Orders the waiting queue by effective priority (admission_order::priority), stably: FCFS among equals, and
  /// recompute victims, pushed in front, stay in front of their equals. Allocates nothing once the scratch buffer
  /// has grown; an already ordered queue (the common case) is only scanned.
  void order_waiting(admission_order order) {
    if (order == admission_order::fcfs || waiting_.size() < 2) return;
    std::int64_t prev = INT64_MAX;
    bool ordered = true;
    for (const seq_id id : waiting_) {
      const std::int64_t p = reqs_.at_id(id).effective_priority();
      if (p > prev) {
        ordered = false;
        break;
      }
      prev = p;
    }
    if (ordered) return;
    keyed_.clear();
    for (const seq_id id : waiting_)
      keyed_.push_back({reqs_.at_id(id).effective_priority(), static_cast<std::int64_t>(keyed_.size()), id});
    std::sort(keyed_.begin(), keyed_.end(), [](const keyed_id& a, const keyed_id& b) {
      return a.priority != b.priority ? a.priority > b.priority : a.position < b.position;
    });
    ids_.clear();
    for (const keyed_id& k : keyed_) ids_.push_back(k.id);
    waiting_.assign_same_size(ids_);
  }

  /// Request `id` (slot `s`) joins the end of the running queue.
  void push_running(seq_id id, slot_type s) {
    running_.push_back(id);
    running_slots_.push_back(s);
    reqs_[s].where = request_state::running;
  }

  /// Removes `id` from the running queue (and its slot beside it).
  void erase_running(seq_id id) noexcept {
    const auto it = std::find(running_.begin(), running_.end(), id);
    if (it == running_.end()) return;
    running_slots_.erase(running_slots_.begin() + (it - running_.begin()));
    running_.erase(it);
  }

  /// Every waiting request waited one more step: `aging` raises its priority (priority_aging::tick).
  void age_waiting(const priority_aging& aging) noexcept {
    if (!aging.enabled()) return;
    for (const seq_id id : waiting_) {
      sched_request& r = reqs_.at_id(id);
      aging.tick(r.waited, r.aged);
    }
  }

  /// Every swapped-out request waited one more step (scheduler_config::priority_preemption: a request displaced by
  /// swap ages while it is off the device, as a recompute victim does in the waiting queue).
  void age_swapped(const priority_aging& aging) noexcept {
    if (!aging.enabled()) return;
    for (const seq_id id : swapped_) {
      sched_request& r = reqs_.at_id(id);
      aging.tick(r.waited, r.aged);
    }
  }

  /// A waiting request with its sort key (order_waiting).
  struct keyed_id {
    std::int64_t priority;
    std::int64_t position;
    seq_id id;
  };

  scheduler_stats stats_;
  request_table reqs_;
  request_queue waiting_;
  std::vector<seq_id> running_;
  std::vector<slot_type> running_slots_;  ///< the slot of running_[i] in reqs_
  request_queue swapped_;
  std::vector<seq_id> loading_;  ///< admitted, waiting for host tier loads or external KV, in admission order
  std::vector<seq_id> held_;     ///< finished, sequences kept for a KV transfer until released (scheduler::hold)
  std::vector<std::pair<seq_id, seq_id>> forks_;
  std::vector<slot_type> pass_;     ///< scratch: the running queue at the start of the step's pass over it
  std::vector<slot_type> partial_;  ///< scratch: running requests computing a prompt in chunks, in running order
  std::vector<keyed_id> keyed_;     ///< scratch: the waiting queue with its sort keys (order_waiting)
  std::vector<seq_id> ids_;         ///< scratch: the waiting queue in its new order (order_waiting)
};

using scheduler_queues = basic_scheduler_queues<>;

KVPAGER_NAMESPACE_END
