#pragma once
/// \file
/// scheduler: a continuous-batching helper an engine drives step by step, on top of a paged_kv_cache. It keeps the
/// waiting, running and swapped queues, admits requests against a watermark (OK / LATER / NEVER, so a request that
/// can never fit is rejected at once instead of blocking the queue, vLLM issue #39734), grows running sequences by
/// one token per step, preempts under shortage (by the cache's swap policy: swap or recompute), swaps sequences back
/// in before admitting new ones, admits nothing in a step that preempted, and ages waiting requests so none starves.
///
/// One step:
/// \code
///   const kvpager::step_output& out = sched.schedule();   // plan: swaps, copies, slot mapping, scheduled sequences
///   executor.execute(cache.plan(), out.slot_mapping, ...);  // the engine runs the model on out.scheduled
///   for (auto& s : out.scheduled) sched.complete(s.id, sampled_token, finished);
/// \endcode
/// Sequences carry their token ids (prompt, then every sampled token), so prefix caching works and a request
/// preempted by recompute is re-admitted with all its tokens.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvpager/cache/paged_kv_cache.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Answer of an admission check.
enum class admission {
  ok,     ///< fits now, watermark kept
  later,  ///< does not fit now; may once other requests finish
  never,  ///< cannot fit even in an empty cache: rejected
};

/// Which running request is preempted first when blocks run out.
enum class preemption_order {
  newest_first,    ///< the most recently admitted (vLLM's FCFS victim: the tail of the running queue)
  lowest_priority  ///< the lowest (aged) priority, newest among equals (vLLM's PRIORITY policy)
};

struct scheduler_config {
  std::int32_t max_num_seqs = 256;             ///< running requests at most
  std::int64_t max_num_batched_tokens = 8192;  ///< tokens computed per step at most
  /// Blocks kept free when admitting or swapping in, in permille of the usable blocks (10 = 1%, vLLM V0's
  /// default; the seed's example keeps 100 = 10%).
  std::int32_t watermark_permille = 10;
  preemption_order victim = preemption_order::newest_first;
  /// A waiting request gains one priority level per `aging_steps` steps it waits (0 = no aging).
  std::int32_t aging_steps = 0;
};

/// A sequence scheduled in a step and how many tokens it computes.
struct scheduled_sequence {
  seq_id id = 0;
  std::int32_t num_tokens = 0;  ///< 1 for a decode; the uncached part of the prompt for a (re-)admission
  bool prefill = false;
};

/// What one schedule() call decided. Byte movement is in the cache's plan(); its slot mapping is copied here.
struct step_output {
  std::vector<scheduled_sequence> scheduled;  ///< in slot-mapping order
  std::vector<seq_id> preempted_recompute;    ///< freed; back at the front of the waiting queue
  std::vector<seq_id> swapped_out;            ///< now in the swapped queue
  std::vector<seq_id> swapped_in;             ///< back to running (and scheduled)
  std::vector<seq_id> rejected;               ///< admission::never: dropped from the waiting queue
  std::vector<std::int64_t> slot_mapping;     ///< cache.export_slot_mapping() of this step
  const step_plan* plan = nullptr;            ///< the cache's plan: swap-outs, swap-ins, copies, appends
};

/// Counters over the scheduler's life.
struct scheduler_stats {
  std::int64_t steps = 0;
  std::int64_t admitted = 0;
  std::int64_t finished = 0;
  std::int64_t rejected = 0;
  std::int64_t preempted_recompute = 0;
  std::int64_t preempted_swap = 0;
  std::int64_t swapped_in = 0;
  std::int32_t waiting = 0;
  std::int32_t running = 0;
  std::int32_t swapped = 0;
};

template <class Cache>
class scheduler {
 public:
  scheduler(Cache& cache, scheduler_config cfg = {}) : cache_(cache), cfg_(cfg) {}

  /// Queues a request. Returns admission::never (and does not queue it) if its prompt cannot fit even in an empty
  /// cache with the watermark kept; otherwise whether it would fit now. Errors: errc::duplicate_sequence,
  /// errc::invalid_argument (empty prompt).
  result<admission> add_request(seq_id id, std::span<const token_id> prompt, std::int32_t priority = 0) {
    if (prompt.empty()) return status{errc::invalid_argument, "add_request: empty prompt"};
    if (reqs_.count(id) != 0 || cache_.contains(id))
      return status{errc::duplicate_sequence, "add_request: request id is already known"};
    request r;
    r.tokens.assign(prompt.begin(), prompt.end());
    r.priority = priority;
    const admission a = check(r);
    if (a == admission::never) {
      ++stats_.rejected;
      return a;
    }
    reqs_.emplace(id, std::move(r));
    waiting_.push_back(id);
    return a;
  }

  /// The admission answer for a prompt of `num_tokens` tokens right now (without prefix hits).
  [[nodiscard]] admission check_tokens(std::int64_t num_tokens) const noexcept {
    const std::int64_t need = cache_.blocks_needed(num_tokens);
    const std::int64_t usable = cache_.stats().total;
    if (need + watermark_blocks() > usable) return admission::never;
    return cache_.available_blocks() - need >= watermark_blocks() ? admission::ok : admission::later;
  }

  /// One scheduling step; the previous step's plan must have been executed.
  const step_output& schedule() {
    cache_.begin_step();
    out_ = step_output{};
    out_.plan = &cache_.plan();
    ++stats_.steps;
    for (const auto& [parent, child] : forks_) {  // requested since the last step; its bytes are in place now
      const auto it = reqs_.find(parent);
      if (it == reqs_.end() || std::find(running_.begin(), running_.end(), parent) == running_.end()) continue;
      if (!cache_.fork(parent, child, it->second.computed)) continue;
      request copy = it->second;
      reqs_.emplace(child, std::move(copy));
      running_.push_back(child);
    }
    forks_.clear();
    std::int64_t budget = cfg_.max_num_batched_tokens;
    bool preempted = false;

    // 1. Grow running requests by their pending token; preempt on shortage.
    for (std::size_t i = 0; i < running_.size() && budget > 0;) {
      const seq_id id = running_[i];
      request& r = reqs_.at(id);
      const auto pending = static_cast<std::int32_t>(r.tokens.size()) - r.computed;
      const std::int32_t n = static_cast<std::int32_t>(std::min<std::int64_t>(pending, budget));
      bool self = false;
      for (;;) {
        const auto span = std::span<const token_id>(r.tokens).subspan(static_cast<std::size_t>(r.computed),
                                                                      static_cast<std::size_t>(n));
        const status st = cache_.append_tokens(id, span);
        if (st.ok()) break;
        if (st.code() != errc::out_of_blocks) return out_;  // cannot happen for a running sequence
        const seq_id victim = pick_victim(i);
        preempted = true;
        if (!preempt(victim)) return out_;
        if (victim == id) {
          self = true;
          break;
        }
      }
      if (self) break;  // running_ shrank by the victim at index >= i
      r.computed += n;
      out_.scheduled.push_back({id, n, false});
      budget -= n;
      ++i;
    }

    if (!preempted) {
      // 2. Swap in before admitting anything new (oldest first), watermark kept.
      while (!swapped_.empty() && static_cast<std::int32_t>(running_.size()) < cfg_.max_num_seqs && budget > 0) {
        const seq_id id = swapped_.front();
        request& r = reqs_.at(id);
        if (cache_.available_blocks() - static_cast<std::int64_t>(r.host_blocks) < watermark_blocks()) break;
        if (!cache_.swap_in(id)) break;
        swapped_.pop_front();
        running_.push_back(id);
        out_.swapped_in.push_back(id);
        ++stats_.swapped_in;
        // Its pending token is computed in this step too.
        const auto pending = static_cast<std::int32_t>(r.tokens.size()) - r.computed;
        if (pending > 0 && budget >= pending &&
            cache_.append_tokens(id, std::span<const token_id>(r.tokens).subspan(static_cast<std::size_t>(r.computed)))) {
          r.computed += pending;
          out_.scheduled.push_back({id, pending, false});
          budget -= pending;
        }
      }
      // 3. Admit waiting requests in (aged) priority order, FCFS among equals.
      if (swapped_.empty()) admit(budget);
    }
    age_waiting();
    out_.slot_mapping.resize(static_cast<std::size_t>(cache_.slot_mapping_size()));
    (void)cache_.export_slot_mapping(out_.slot_mapping);
    return out_;
  }

  /// Parallel sampling: at the start of the next step (once this step's bytes are written), request `child` starts
  /// as a copy of running request `parent` (same tokens, sharing its blocks by reference count; the first write
  /// into a shared partial block copies it). Errors: errc::unknown_sequence (parent not running),
  /// errc::duplicate_sequence (child known).
  status fork(seq_id parent, seq_id child) {
    if (std::find(running_.begin(), running_.end(), parent) == running_.end())
      return status{errc::unknown_sequence, "fork: the parent is not running"};
    if (reqs_.count(child) != 0 || cache_.contains(child))
      return status{errc::duplicate_sequence, "fork: the child id is already known"};
    for (const auto& f : forks_)
      if (f.second == child) return status{errc::duplicate_sequence, "fork: the child id is already pending"};
    forks_.emplace_back(parent, child);
    return ok_status();
  }

  /// After the step ran: request `id` sampled `next`; if `finished`, it is freed (its last token not kept).
  status complete(seq_id id, token_id next, bool finished = false) {
    const auto it = reqs_.find(id);
    if (it == reqs_.end()) return status{errc::unknown_sequence, "complete: unknown request id"};
    if (finished) return finish(id);
    it->second.tokens.push_back(next);
    return ok_status();
  }

  /// Frees request `id` wherever it is (running, swapped or waiting).
  status finish(seq_id id) {
    const auto it = reqs_.find(id);
    if (it == reqs_.end()) return status{errc::unknown_sequence, "finish: unknown request id"};
    if (cache_.contains(id)) (void)cache_.free_sequence(id);
    erase_from(running_, id);
    erase_from(swapped_, id);
    erase_from(waiting_, id);
    reqs_.erase(it);
    ++stats_.finished;
    return ok_status();
  }

  [[nodiscard]] scheduler_stats stats() const noexcept {
    scheduler_stats s = stats_;
    s.waiting = static_cast<std::int32_t>(waiting_.size());
    s.running = static_cast<std::int32_t>(running_.size());
    s.swapped = static_cast<std::int32_t>(swapped_.size());
    return s;
  }
  [[nodiscard]] std::span<const seq_id> running() const noexcept { return running_; }
  [[nodiscard]] const std::deque<seq_id>& waiting() const noexcept { return waiting_; }
  [[nodiscard]] const std::deque<seq_id>& swapped() const noexcept { return swapped_; }
  /// Token ids of request `id` (prompt, then sampled tokens), or an empty span.
  [[nodiscard]] std::span<const token_id> tokens(seq_id id) const noexcept {
    const auto it = reqs_.find(id);
    return it == reqs_.end() ? std::span<const token_id>{} : std::span<const token_id>(it->second.tokens);
  }
  /// Effective priority of request `id` (its priority plus aging).
  [[nodiscard]] std::int32_t priority(seq_id id) const noexcept {
    const auto it = reqs_.find(id);
    return it == reqs_.end() ? 0 : it->second.priority + it->second.aged;
  }
  [[nodiscard]] const scheduler_config& config() const noexcept { return cfg_; }

 private:
  struct request {
    std::vector<token_id> tokens;
    std::int32_t computed = 0;  ///< tokens with KV in the cache
    std::int32_t priority = 0;
    std::int32_t aged = 0;      ///< priority gained while waiting
    std::int32_t waited = 0;    ///< steps waited since the last aging increment
    std::int32_t host_blocks = 0;
  };

  [[nodiscard]] std::int64_t watermark_blocks() const noexcept {
    return std::int64_t{cache_.stats().total} * cfg_.watermark_permille / 1000;
  }
  [[nodiscard]] admission check(const request& r) const noexcept {
    return check_tokens(static_cast<std::int64_t>(r.tokens.size()));
  }

  /// The victim among running_[from..]: requests already scheduled in this step are kept.
  seq_id pick_victim(std::size_t from) const {
    if (cfg_.victim == preemption_order::newest_first) return running_.back();
    // Lowest effective priority; the newest among equals.
    std::size_t best = running_.size() - 1;
    for (std::size_t i = running_.size(); i-- > from;) {
      const request& r = reqs_.at(running_[i]);
      const request& b = reqs_.at(running_[best]);
      if (r.priority + r.aged < b.priority + b.aged) best = i;
    }
    return running_[best];
  }

  bool preempt(seq_id victim) {
    request& r = reqs_.at(victim);
    const std::int32_t blocks = static_cast<std::int32_t>(cache_.blocks_needed(r.computed));
    const auto a = cache_.preempt(victim);
    preempt_action action = preempt_action::recompute;
    if (a.ok()) {
      action = *a;
    } else if (a.code() == errc::host_pool_full) {
      if (!cache_.free_sequence(victim)) return false;  // no host room: recompute (counted as such)
    } else {
      return false;
    }
    erase_from(running_, victim);
    if (action == preempt_action::swap) {
      r.host_blocks = blocks;
      swapped_.push_back(victim);
      out_.swapped_out.push_back(victim);
      ++stats_.preempted_swap;
    } else {
      r.computed = 0;
      waiting_.push_front(victim);
      out_.preempted_recompute.push_back(victim);
      ++stats_.preempted_recompute;
    }
    return true;
  }

  void admit(std::int64_t& budget) {
    // Highest effective priority first; stable, so FCFS among equals (recompute victims were pushed in front).
    std::stable_sort(waiting_.begin(), waiting_.end(), [&](seq_id a, seq_id b) {
      const request& ra = reqs_.at(a);
      const request& rb = reqs_.at(b);
      return ra.priority + ra.aged > rb.priority + rb.aged;
    });
    while (!waiting_.empty() && budget > 0 && static_cast<std::int32_t>(running_.size()) < cfg_.max_num_seqs) {
      const seq_id id = waiting_.front();
      request& r = reqs_.at(id);
      const auto m = cache_.match_prefix(r.tokens);
      const std::int64_t n = static_cast<std::int64_t>(r.tokens.size()) - m->tokens;
      if (n > budget) break;
      const std::int64_t need = m->blocks_to_allocate;
      if (need + watermark_blocks() > cache_.stats().total) {  // can never fit: reject instead of blocking
        waiting_.pop_front();
        out_.rejected.push_back(id);
        reqs_.erase(id);
        ++stats_.rejected;
        continue;
      }
      if (cache_.available_blocks() - need < watermark_blocks()) break;  // LATER
      if (!cache_.add_sequence(id, r.tokens, {.priority = r.priority})) break;
      waiting_.pop_front();
      running_.push_back(id);
      r.computed = static_cast<std::int32_t>(r.tokens.size());
      r.aged = 0;
      r.waited = 0;
      out_.scheduled.push_back({id, static_cast<std::int32_t>(n), true});
      budget -= n;
      ++stats_.admitted;
    }
  }

  void age_waiting() {
    if (cfg_.aging_steps <= 0) return;
    for (const seq_id id : waiting_) {
      request& r = reqs_.at(id);
      if (++r.waited >= cfg_.aging_steps) {
        r.waited = 0;
        ++r.aged;
      }
    }
  }

  template <class Queue>
  static void erase_from(Queue& q, seq_id id) {
    const auto it = std::find(q.begin(), q.end(), id);
    if (it != q.end()) q.erase(it);
  }

  Cache& cache_;
  scheduler_config cfg_;
  std::unordered_map<seq_id, request> reqs_;
  std::deque<seq_id> waiting_;
  std::vector<seq_id> running_;
  std::deque<seq_id> swapped_;
  step_output out_;
  scheduler_stats stats_;
  std::vector<std::pair<seq_id, seq_id>> forks_;
};

KVPAGER_NAMESPACE_END
