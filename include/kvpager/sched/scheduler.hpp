// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// scheduler: a continuous-batching helper an engine drives step by step over a paged_kv_cache. It keeps the
/// waiting, running and swapped queues (scheduler_queues), admits against a watermark (admission_limits: OK / LATER /
/// NEVER, so a request that can never run is rejected at once, vLLM issue #39734), computes prompts in chunks within
/// the token budget (running decodes first, then partial prompts, then admissions, as vLLM v1), preempts under
/// shortage by swap or by recompute (the scheduler frees a recompute victim itself, so it works over any cache),
/// swaps back in before admitting, admits nothing in a step that preempted, and ages waiting requests. No request is
/// left stuck: each is finished by the engine, by the scheduler (step_output::finished: length cap, can no longer be
/// computed) or rejected with admission::never. Engine behaviours are presets (scheduler_config::vllm_v1()).
/// One step (docs/architecture.md): the step_output is everything the model runner consumes.
/// \code
///   const kvpager::step_output& out = sched.schedule();  // begins the step: plan, slots, tokens, page tables
///   executor.run_plan(*out.plan);                          // swaps and copies, every layer (step_executor)
///   for each layer: executor.append(layer, out.slot_mapping, k, v);  // then attention over out.decode, out.prefill
///   for (std::size_t i = 0; i < out.scheduled.size(); ++i)  // no token for a prefill chunk that is not the last
///     if (out.scheduled[i].last_chunk) sched.complete_scheduled(i, sampled_token, finished);
/// \endcode
/// Sequences carry their token ids, so prefix caching works and a recompute victim is re-admitted with all its
/// tokens (and its block hashes). In steady state schedule() allocates nothing: the output and scratch are reused.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/cache/paged_kv_cache.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/sched/admission_limits.hpp"
#include "kvpager/sched/scheduler_queues.hpp"
#include "kvpager/sched/scheduler_config.hpp"
#include "kvpager/sched/scheduler_tuning.hpp"
#include "kvpager/sched/step_output.hpp"

KVPAGER_NAMESPACE_BEGIN

template <class Cache>
class scheduler : public scheduler_queues {
 public:
  scheduler(Cache& cache, scheduler_config cfg = {});
  // Copyable and movable (nothrow), not assignable (it refers to its cache); declared here so that they too are
  // compiled once with the named compositions (KVPAGER_EXTERN_COMPOSITIONS, core/config.hpp).
  scheduler(const scheduler&);
  scheduler(scheduler&&) noexcept;
  ~scheduler();

  /// Block tables per sequence of `cache`: its KV cache groups' tables (hybrid_kv_cache::num_tables; 1 without
  /// groups), so the pool blocks a block of tokens takes.
  [[nodiscard]] static std::int32_t groups_of(const Cache& cache) noexcept {
    if constexpr (requires { cache.num_groups(); }) {
      return cache.num_tables();
    } else {
      (void)cache;
      return 1;
    }
  }

  /// A scheduler over `cache` once `cfg` passes scheduler_config::validate (its error otherwise). The constructor
  /// takes any config: a bad batch_tuning is off there, a bad swap_cost makes preemption_mode::adaptive recompute.
  [[nodiscard]] static result<scheduler> create(Cache& cache, const scheduler_config& cfg);

  /// Queues a request. `options` reach the cache with every admission of the request: `extra_key` (a tenant's
  /// salt, a LoRA adapter id: blocks cached under different keys never hit each other) and `priority` (admission
  /// order with admission_order::priority, victim choice with preemption_order::lowest_priority, and the
  /// retention priority of its cached blocks). Returns admission::never (and does not queue it) if it can never
  /// run: its prompt cannot fit even in an empty cache with the watermark kept, needs more than
  /// max_blocks_per_seq blocks, or (chunked prefill off) is longer than max_num_batched_tokens (or the
  /// configuration runs nothing: max_num_seqs or max_num_batched_tokens below 1); otherwise whether it would fit
  /// now. With scheduler_config::reject_impossible off, such a request is queued and answered admission::later
  /// (a prompt over max_blocks_per_seq is still rejected). Errors (nothing changed): errc::duplicate_sequence (a
  /// known request, a pending fork child, or a sequence in the cache), errc::invalid_argument (empty prompt).
  result<admission> add_request(seq_id id, std::span<const token_id> prompt, sequence_options options);

  /// add_request with `priority` and no extra key.
  result<admission> add_request(seq_id id, std::span<const token_id> prompt, std::int32_t priority = 0);

  /// The admission answer for a prompt of `num_tokens` tokens right now (without prefix hits).
  [[nodiscard]] admission check_tokens(std::int64_t num_tokens) const noexcept;

  /// One scheduling step; it begins the cache's step (the previous step's plan must have been executed). The
  /// returned step_output holds the plan (out.plan, the cache's: valid until the step's first successful complete()
  /// or complete_scheduled(), which takes the step as executed; a refused one changes nothing), and copies of
  /// everything else (valid until the next schedule()). In order: pending forks, priority preemption
  /// (scheduler_config::priority_preemption: the waiting head that outranks running requests displaces them and is
  /// admitted first), running decodes, partially computed prompts, swap-ins, admissions (the last two not in a step
  /// that preempted).
  const step_output& schedule();

  /// Parallel sampling: at the start of the next step (once this step's bytes are written), request `child` starts
  /// as a copy of running request `parent` (same tokens, sharing its blocks by reference count; the first write
  /// into a shared partial block copies it); it is listed in step_output::forked. A child of a parent still waiting
  /// for its sampled token (complete not called yet) waits for its own: give it with complete(child, ...). If the
  /// parent no longer runs then (finished) or the cache refuses the fork, the child is not created and is listed in
  /// step_output::dropped_forks. Errors (nothing changed): errc::unknown_sequence (parent not running),
  /// errc::duplicate_sequence (child known or pending).
  status fork(seq_id parent, seq_id child);

  /// After the step ran: request `id` sampled `next`; if `finished`, it is freed wherever it is (its last token not
  /// kept; this also cancels a request mid-prefill, or a pending fork child). Without `finished`, the request must
  /// be running with every token computed (a scheduled sequence with last_chunk): a token for a prefill chunk that
  /// is not the prompt's last, for a waiting or swapped request, or a second token for one step is refused with
  /// errc::invalid_argument and changes nothing. errc::unknown_sequence for an unknown id.
  status complete(seq_id id, token_id next, bool finished = false);

  /// complete() for entry `i` of the last step's step_output::scheduled, without looking its id up (an engine
  /// walking the step's output in order). errc::invalid_argument for an index past the step's entries; otherwise
  /// exactly as complete(out.scheduled[i].id, next, finished).
  KVPAGER_FLATTEN status complete_scheduled(std::size_t i, token_id next, bool finished = false);

 public:
  /// Computes the pending tokens of running request `id` outside schedule(), for an engine that ran them itself
  /// (a decode it decided on its own): their slots are appended in the cache, planned in the current step, and
  /// complete() then takes the request's next token. Never preempts: on a shortage nothing changes. Errors
  /// (nothing changed): errc::unknown_sequence (not a running request), errc::invalid_argument (no pending
  /// token), the cache's errors (errc::out_of_blocks).
  status compute_pending(seq_id id);

  /// Frees request `id` wherever it is (running, swapped, waiting, or a fork child still pending). A held request
  /// (hold) that finishes running keeps its sequence in the cache until release.
  status finish(seq_id id);

  /// When running request `id` finishes by complete(..., finished = true) (its step executed), its sequence stays in
  /// the cache, blocks and all, instead of being freed: a prefill instance's request whose KV a decode instance
  /// reads (docs/disaggregated.md). The id stays taken until release(id). Any other end (finish(), a stop the
  /// scheduler applies, a cache error, or finishing while not running) frees it as usual; a fork child does not
  /// inherit the hold. errc::unknown_sequence for an unknown request.
  status hold(seq_id id);
  /// Frees held sequence `id` (its KV was read, or will not be). errc::unknown_sequence for an id not held.
  status release(seq_id id);
  /// Sequences held (finished, kept for a transfer), oldest first.
  [[nodiscard]] std::span<const seq_id> held() const noexcept { return detail::span_of(held_); }

  [[nodiscard]] const scheduler_config& config() const noexcept { return cfg_; }
  /// The auto-tuning policies (batch size limit, swap-or-recompute model); the engine's measurements reach the
  /// latter through preemption_model(). The setters replace config().batch_tuning / swap_cost between steps
  /// (scheduler_tuners::set_batch_tuning, set_swap_cost); errors (nothing changed): the tuning config's validate().
  [[nodiscard]] const scheduler_tuners& tuning() const noexcept { return tuners_; }
  [[nodiscard]] adaptive_preemption& preemption_model() noexcept { return tuners_.preemption(); }
  status set_batch_tuning(const batch_size_tuning& t) noexcept { return tuners_.set_batch_tuning(cfg_, t); }
  status set_swap_cost(const swap_cost_model& m) noexcept { return tuners_.set_swap_cost(cfg_, m); }

 private:
  /// The first sampled token of a step (a complete or complete_scheduled call that succeeds) says the step ran, its
  /// plan executed: the cache's step ends there (cache.begin_step(): blocks a planned copy kept busy are free again
  /// before the finished requests free theirs, in vLLM's order). The scheduler owns the step boundary: an engine never
  /// calls begin_step() around a scheduler step.
  void plan_executed();
  /// Ends the cache's step (begin_step) whether or not schedule() opened one.
  void plan_executed_now();
  /// A token was given (`st` ok): the step ran. A refused token changes nothing, the open step included.
  status taken(status st);

  /// An allocation the scheduler made succeeded: the peak of blocks in use.
  void note_allocation() noexcept {
    stats_.peak_used_blocks = std::max(stats_.peak_used_blocks, usable_blocks() - cache_.available_blocks());
  }

  [[nodiscard]] std::int64_t usable_blocks() const noexcept { return limits_.usable_blocks; }
  [[nodiscard]] std::optional<finish_reason> limit_reached(std::int64_t n, bool whole) const noexcept {
    return limits_.limit_reached(cfg_, n, whole);
  }
  [[nodiscard]] std::int64_t blocks_to_keep(std::int64_t need) const noexcept {
    return limits_.blocks_to_keep(cfg_, running_.empty(), need);
  }

  /// Forks requested since the last step; their parents' bytes are in place now.
  KVPAGER_NOINLINE void start_forks();

  /// Requests waiting for host tier loads: those whose loads are all in run (their prompt continues as a partial
  /// prompt) while a running slot is free; those whose loads failed or timed out are freed and queued again at the
  /// front (recomputed after the blocks that arrived, which the cache has cached).
  void poll_loads();
  /// Running slots taken: running requests and those waiting for loads (each holds a slot for when they are in, so
  /// max_num_seqs bounds the running queue whenever they arrive).
  [[nodiscard]] std::int64_t occupied() const noexcept {
    return static_cast<std::int64_t>(running_.size() + loading_.size());
  }

  /// The running queue in order: decodes first; the requests computing a prompt in chunks are set aside and
  /// continue after them.
  KVPAGER_FLATTEN void run_running();

  /// Whether `r` is (still) running and not scheduled in this step (a victim leaves the running queue; a finished
  /// request's slot is free).
  [[nodiscard]] bool unscheduled_running(const sched_request& r) const noexcept {
    return r.where == request_state::running && r.step != step_;
  }

  /// Schedules the pending tokens of running request `r` within the budget (a chunk of them with chunked prefill;
  /// all or none without). On shortage, with `may_preempt`, preempts victims until they fit or `r` itself is the
  /// victim; without, leaves them pending. A request past its limits is finished with the reason.
  KVPAGER_FLATTEN void compute(sched_request& r, slot_type slot, bool may_preempt);

  /// `n` tokens of `r` from position `start` were appended in the cache: its entry in the step.
  void record(sched_request& r, slot_type slot, std::int32_t start, std::int32_t n);

  /// scheduler_config::export_tables: the step's tokens, positions and query_start_loc, and each group's page
  /// tables. Every scheduled sequence runs in the cache now (a victim is never one scheduled in the step), so the
  /// exports cannot fail; if the cache refuses one anyway, its status is the step's error and the tables are empty.
  KVPAGER_NOINLINE void export_tables();

  /// The page tables of group `g` (its entries are set): CSR from the cache, the dense table from the CSR; from
  /// KV cache group `kv_group` of a cache with groups.
  status export_group(step_tables& g, std::int32_t kv_group = 0);

  /// Takes running request `victim` off the device by the configured mode, by recompute where a swap is refused.
  KVPAGER_NOINLINE void preempt(seq_id victim);

  /// A recompute victim, before the cache frees it: its block hashes, so its re-admission hashes nothing again.
  /// A swap keeps the sequence (and its hashes) in the cache: nothing to read.
  void keep_hashes(seq_id victim) { (void)cache_.block_hashes(victim, reqs_.at_id(victim).block_hashes); }

  /// Swapped requests back in, oldest first, the watermark kept unless nothing runs; each computes its pending
  /// tokens in this step where the budget and blocks allow.
  KVPAGER_NOINLINE void swap_in();

  /// Admits waiting requests in (aged) priority order, FCFS among equals, each with its prefix hit and a first
  /// chunk of its uncached tokens within the budget.
  KVPAGER_NOINLINE void admit();

  /// What one admission attempt did with the head of the waiting queue.
  enum class admit_outcome {
    admitted,  ///< admitted, its first chunk scheduled
    removed,   ///< finished (a limit) or failed: the next request is at the head
    stopped,   ///< its blocks do not fit now (with the watermark): stays at the head
    budget_stop,  ///< chunked prefill off and its uncached tokens exceed the step's budget: stays at the head
  };

  /// The first chunk an admission of `r` (`n` tokens, prefix hit `m`) would take: where it ends and the blocks it
  /// needs; budget_stop when chunked prefill is off and the uncached tokens do not fit the budget.
  struct first_chunk {
    bool budget_stop = false;
    std::int64_t end = 0, need = 0;
  };
  [[nodiscard]] first_chunk plan_first_chunk(std::int64_t n, const prefix_match& m) const;

  /// One admission attempt of the head of the waiting queue (budget and a running slot left). `count`: a stop is
  /// counted in admit_fail / admit_budget_stop.
  admit_outcome admit_front(bool count);

  /// scheduler_config::priority_preemption, at the start of a step (nothing scheduled yet, so any running request
  /// may be a victim): while the head of the waiting queue cannot be admitted for lack of blocks or of a running
  /// slot, the lowest-priority running request it outranks is preempted by the configured mode; once it fits, the
  /// head is admitted. Nothing happens while requests are swapped out (they come back before anything new) or when
  /// the head fits already (it is admitted in turn, after the running requests), and nothing is preempted for a head
  /// that the token budget stops (chunked prefill off: preempting cannot help).
  KVPAGER_NOINLINE void preempt_for_priority();

  /// The prefix lookup of waiting request `r` into hit_; with KV cache groups, the block hashes it computed are
  /// kept with the request (none is hashed twice while it waits).
  status match_head(sched_request& r);

  /// Whether the head of the waiting queue would be admitted now (its blocks and the watermark; a head that a limit
  /// or the token budget stops counts as fitting: preempting cannot help it).
  [[nodiscard]] bool head_fits();

  /// The running request priority preemption displaces for a waiting request of priority `priority` (its own,
  /// unaged): among those whose aged priority is strictly below it, the lowest, newest among equals; none if no
  /// running request is outranked. Comparing the displacer's own priority with the victim's aged one is what makes
  /// aging protect: a request that aged above every priority that arrives can no longer be displaced, and no two
  /// requests can displace each other in turn (that would need p(A) > e(B) >= p(B) > e(A) >= p(A)).
  [[nodiscard]] std::optional<seq_id> priority_victim(std::int32_t priority) const;

  /// The scheduler ends request `id` itself (`why`), reported in step_output::finished.
  KVPAGER_NOINLINE void finish_with(seq_id id, finish_reason why);
  /// finish(); `may_hold`: a held request that finishes running keeps its sequence (only when the engine completes
  /// it, its step executed: a cancel, a stop the scheduler applies or a cache error frees it).
  status finish_impl(seq_id id, bool may_hold);

  /// The cache refused a call it cannot refuse for a sequence the scheduler owns: the request ends (its cache
  /// sequence, if any, is freed), so the scheduler's queues stay consistent with the cache.
  KVPAGER_NOINLINE void fail(seq_id id, status st);

  Cache& cache_;
  scheduler_config cfg_;
  step_output out_;
  std::vector<slot_type> scheduled_slots_;  ///< the slot of out_.scheduled[i] (complete_scheduled)
  std::vector<seq_id> group_ids_;           ///< scratch of export_group: the ids of a group's rows
  admission_limits limits_;                 ///< the admission arithmetic over the cache's fixed figures
  bool may_hit_limit_;  ///< a running request can reach a limit: the length cap, or (reject_impossible) the cache
  prefix_hit hit_;                  ///< scratch: the admission's lookup, consumed by add_sequence
  static constexpr prefix_match no_match_{};  ///< the lookup skipped: no hit assumed for the tests
  std::uint64_t step_ = 0;
  std::int64_t budget_ = 0;  ///< tokens left in this step
  std::int64_t max_running_ = 0;  ///< running requests allowed in this step (max_num_seqs, tuned)
  scheduler_tuners tuners_;
  bool preempted_ = false;   ///< this step preempted: no swap-in, no admission
  bool step_open_ = false;   ///< schedule() returned and no token of its step was given yet (plan_executed)
  bool stop_running_ = false;
};

// ------------------------------------------------------------------------------------------------ definitions

template <class Cache>
KVPAGER_OUT_OF_LINE scheduler<Cache>::scheduler(Cache& cache, scheduler_config cfg)
    : cache_(cache),
      cfg_(cfg),
      limits_{.usable_blocks = std::int64_t{cache.config().num_blocks} - cache.config().reserved_blocks,
              .block_size = cache.config().block_size,
              .max_blocks_per_seq = cache.config().max_blocks_per_seq,
              .num_groups = groups_of(cache)},
      may_hit_limit_(cfg.reject_impossible || cache.config().max_blocks_per_seq > 0),
      tuners_(cfg) {}
template <class Cache>
KVPAGER_OUT_OF_LINE scheduler<Cache>::scheduler(const scheduler&) = default;
template <class Cache>
KVPAGER_OUT_OF_LINE scheduler<Cache>::scheduler(scheduler&&) noexcept = default;
template <class Cache>
KVPAGER_OUT_OF_LINE scheduler<Cache>::~scheduler() = default;

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::create(Cache& cache, const scheduler_config& cfg) -> result<scheduler> {
  if (const status st = cfg.validate(); !st) return st;
  return scheduler(cache, cfg);
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::add_request(seq_id id, std::span<const token_id> prompt,
                                                       sequence_options options) -> result<admission> {
  if (prompt.empty()) return status{errc::invalid_argument, "add_request: empty prompt"};
  if (options.external_tokens < 0)
    return status{errc::invalid_argument, "add_request: external_tokens must not be negative", options.external_tokens};
  if (known(id) || cache_.contains(id))
    return status{errc::duplicate_sequence, "add_request: request id is already known"};
  admission a = check_tokens(static_cast<std::int64_t>(prompt.size()));
  if (a == admission::never) {
    if (cfg_.reject_impossible || limit_reached(static_cast<std::int64_t>(prompt.size()), true)) {
      ++stats_.rejected;
      return a;
    }
    a = admission::later;
  }
  sched_request& r = reqs_[reqs_.add(id)];
  r.tokens.assign(prompt.begin(), prompt.end());
  r.prompt_len = static_cast<std::int32_t>(prompt.size());
  r.options = options;
  waiting_.push_back(id);
  ++(a == admission::ok ? stats_.answered_ok : stats_.answered_later);
  return a;
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::add_request(seq_id id, std::span<const token_id> prompt,
                                                       std::int32_t priority) -> result<admission> {
  return add_request(id, prompt, sequence_options{.priority = priority});
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::check_tokens(std::int64_t num_tokens) const noexcept -> admission {
  return limits_.check(cfg_, num_tokens, cache_.available_blocks());
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::schedule() -> const step_output& {
  // The step boundary, once per step: plan_executed() ended the last step at its first token; a step that gave none
  // (or the first) ends here. A second begin_step would take the new step's plan (a host tier's write-through stores,
  // planned at the boundary) as executed before the engine ran it.
  if (step_open_ || stats_.steps == 0) plan_executed_now();
  out_.clear();
  scheduled_slots_.clear();
  out_.plan = &cache_.plan();
  step_ = static_cast<std::uint64_t>(++stats_.steps);
  start_forks();
  budget_ = cfg_.max_num_batched_tokens;
  max_running_ = tuners_.max_running(cfg_);
  poll_loads();
  preempted_ = false;
  stop_running_ = false;
  preempt_for_priority();
  run_running();
  if (!preempted_) {
    swap_in();
    if (swapped_.empty()) admit();  // swapped requests come back before anything new
  }
  age_waiting(cfg_.aging());
  if (cfg_.priority_preemption) age_swapped(cfg_.aging());
  tuners_.end_step(cfg_, usable_blocks() - cache_.available_blocks(), usable_blocks(), out_);
  if (cfg_.export_slot_mapping) {
    out_.slot_mapping.resize(static_cast<std::size_t>(cache_.slot_mapping_size()));
    (void)cache_.export_slot_mapping(out_.slot_mapping);
  }
  if (cfg_.export_tables) export_tables();
  step_open_ = true;
  return out_;
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::fork(seq_id parent, seq_id child) -> status {
  const sched_request* p = reqs_.get(parent);
  if (p == nullptr || p->where != request_state::running)
    return status{errc::unknown_sequence, "fork: the parent is not running"};
  if (known(child) || cache_.contains(child))
    return status{errc::duplicate_sequence, "fork: the child id is already known"};
  forks_.emplace_back(parent, child);
  return ok_status();
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::complete(seq_id id, token_id next, bool finished) -> status {
  if (finished) {
    if (known(id)) plan_executed();  // an unknown id is an error and changes nothing
    return finish_impl(id, true);  // a held request keeps its sequence
  }
  return taken(take_token(reqs_.get(id), next));
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::complete_scheduled(std::size_t i, token_id next, bool finished) -> status {
  if (i >= out_.scheduled.size()) return status{errc::invalid_argument, "complete_scheduled: no such entry"};
  const seq_id id = out_.scheduled[i].id;
  sched_request& r = reqs_[scheduled_slots_[i]];
  if (finished || r.where == request_state::unknown || r.id != id) return complete(id, next, finished);
  return taken(take_token(&r, next));  // the slot still holds the request: no lookup
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::compute_pending(seq_id id) -> status {
  sched_request* r = reqs_.get(id);
  if (r == nullptr || r->where != request_state::running)
    return status{errc::unknown_sequence, "compute_pending: not a running request"};
  if (r->computed >= r->num_tokens()) return status{errc::invalid_argument, "compute_pending: no pending token"};
  if (const status st = cache_.append_tokens(
          id, std::span<const token_id>(r->tokens).subspan(static_cast<std::size_t>(r->computed)));
      !st)
    return st;
  note_allocation();
  r->computed = static_cast<std::int32_t>(r->num_tokens());
  r->prefilling = false;
  return ok_status();
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::finish(seq_id id) -> status {
  return finish_impl(id, false);
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::finish_impl(seq_id id, bool may_hold) -> status {
  sched_request* r = reqs_.get(id);
  if (r == nullptr) {
    const auto f = std::find_if(forks_.begin(), forks_.end(), [&](const auto& p) { return p.second == id; });
    if (f == forks_.end()) return status{errc::unknown_sequence, "finish: unknown request id"};
    forks_.erase(f);
    ++stats_.finished;
    return ok_status();
  }
  const bool keep = may_hold && r->hold && r->where == request_state::running && cache_.contains(id);
  leave_queue(*r);
  tuners_.finished(cfg_, r->prompt_len, r->num_tokens());
  // A waiting request holds nothing in the cache (a live sequence of that id is not the scheduler's).
  if (keep) {
    held_.push_back(id);
    ++stats_.held;
  } else if (r->where != request_state::waiting && cache_.contains(id)) {
    (void)cache_.free_sequence(id);
  }
  reqs_.erase(id);
  ++stats_.finished;
  return ok_status();
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::hold(seq_id id) -> status {
  sched_request* r = reqs_.get(id);
  if (r == nullptr) return status{errc::unknown_sequence, "hold: unknown request id"};
  r->hold = true;
  return ok_status();
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::release(seq_id id) -> status {
  const auto it = std::find(held_.begin(), held_.end(), id);
  if (it == held_.end()) return status{errc::unknown_sequence, "release: not a held sequence"};
  if (const status st = cache_.free_sequence(id); !st) return st;
  held_.erase(it);
  ++stats_.released;
  return ok_status();
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::plan_executed() -> void {
  if (!step_open_) return;
  plan_executed_now();
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::plan_executed_now() -> void {
  step_open_ = false;
  cache_.begin_step();
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::taken(status st) -> status {
  if (st.ok()) plan_executed();
  return st;
}

template <class Cache>
auto scheduler<Cache>::start_forks() -> void {
  for (const auto& [parent, child] : forks_) {
    const slot_type p = reqs_.find(parent);
    if (p < 0 || reqs_[p].where != request_state::running || !cache_.fork(parent, child, reqs_[p].computed)) {
      out_.dropped_forks.push_back(child);
      ++stats_.dropped_forks;
      continue;
    }
    const slot_type c = reqs_.add(child);  // may move the table: reach the parent by its slot again
    reqs_[c] = reqs_[p];
    reqs_[c].id = child;
    reqs_[c].hold = false;
    reqs_[c].step = 0;
    push_running(child, c);
    out_.forked.push_back(child);
  }
  forks_.clear();
}

template <class Cache>
auto scheduler<Cache>::poll_loads() -> void {
  if constexpr (requires { cache_.complete_tier_transfers({}); }) {
    for (std::size_t i = 0; i < loading_.size();) {
      const seq_id id = loading_[i];
      const result<tier_load_state> st = cache_.load_state(id);
      const bool in = st && *st == tier_load_state::none;
      if ((st && *st == tier_load_state::loading) ||
          (in && static_cast<std::int64_t>(running_.size()) >= max_running_)) {  // a tuned limit fell: it waits
        ++i;
        continue;
      }
      loading_.erase(loading_.begin() + static_cast<std::ptrdiff_t>(i));
      const slot_type s = reqs_.find(id);
      sched_request& r = reqs_[s];
      if (in) {  // all in: a partially computed prompt from here
        r.options.external_tokens = 0;  // used: a later re-admission (after a recompute) computes or hits them
        push_running(id, s);
        continue;
      }
      if (r.options.external_tokens > 0) {  // the transfer failed: computed here from now on
        ++stats_.external_failures;
        r.options.external_tokens = 0;
      } else {
        ++stats_.load_failures;
      }
      requeue(r);  // its re-admission is a resumed one (resumed_prefix)
      if (const status fr = cache_.free_sequence(id); !fr) fail(id, fr);
    }
  }
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::run_running() -> void {
  pass_.assign(running_slots_.begin(), running_slots_.end());
  partial_.clear();
  for (const slot_type s : pass_) {
    if (budget_ <= 0 || stop_running_) return;
    sched_request& r = reqs_[s];
    if (!unscheduled_running(r)) continue;
    if (r.prefilling) {
      partial_.push_back(s);
    } else {
      compute(r, s, true);
    }
  }
  for (const slot_type s : partial_) {
    if (budget_ <= 0 || stop_running_) return;
    if (sched_request& r = reqs_[s]; unscheduled_running(r)) compute(r, s, true);
  }
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::compute(sched_request& r, slot_type slot, bool may_preempt) -> void {
  const seq_id id = r.id;
  if (const auto why = may_hit_limit_ ? limit_reached(r.num_tokens(), false) : std::nullopt) {
    finish_with(id, *why);
    return;
  }
  const std::int64_t pending = r.num_tokens() - r.computed;
  if (pending <= 0) return;  // its sampled token has not been given yet
  const std::int64_t n = std::min(pending, budget_);
  if (!cfg_.chunked_prefill && n < pending) return;
  const auto span = std::span<const token_id>(r.tokens).subspan(static_cast<std::size_t>(r.computed),
                                                                static_cast<std::size_t>(n));
  for (;;) {
    const status st = cache_.append_tokens(id, span);
    if (st.ok()) break;
    if (st.code() != errc::out_of_blocks) {
      fail(id, st);
      return;
    }
    ++stats_.decode_alloc_fail;
    if (!may_preempt) return;
    const seq_id victim = pick_victim(id, step_, cfg_.victim);
    preempt(victim);
    if (victim == id) {
      stop_running_ = true;  // as vLLM: a request that preempted itself ends the pass over the running queue
      return;
    }
  }
  note_allocation();
  record(r, slot, r.computed, static_cast<std::int32_t>(n));
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::record(sched_request& r, slot_type slot, std::int32_t start, std::int32_t n)
    -> void {
  scheduled_slots_.push_back(slot);
  r.computed = start + n;
  const bool last = r.computed == r.num_tokens();
  scheduled_sequence& e = out_.scheduled.emplace_back();  // in place: no temporary to copy
  e.id = r.id;
  e.num_tokens = n;
  e.prefill = r.prefilling;
  e.last_chunk = last;
  e.start = start;
  if (last) r.prefilling = false;
  r.step = step_;
  budget_ -= n;
}

template <class Cache>
auto scheduler<Cache>::export_tables() -> void {
  out_.query_start_loc.push_back(0);
  for (std::size_t i = 0; i < out_.scheduled.size(); ++i) {
    const scheduled_sequence& e = out_.scheduled[i];
    const sched_request& r = reqs_[scheduled_slots_[i]];
    const auto first = r.tokens.begin() + e.start;
    out_.input_ids.insert(out_.input_ids.end(), first, first + e.num_tokens);
    for (std::int32_t j = 0; j < e.num_tokens; ++j) out_.positions.push_back(e.start + j);
    out_.query_start_loc.push_back(out_.query_start_loc.back() + e.num_tokens);
    (e.num_tokens == 1 ? out_.decode : out_.prefill).entries.push_back(static_cast<std::int32_t>(i));
  }
  if constexpr (requires { cache_.num_groups(); }) {  // KV cache groups: every table of every group
    const auto n = static_cast<std::size_t>(cache_.num_tables());
    out_.group_decode.resize(n);
    out_.group_prefill.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      out_.group_decode[k].entries = out_.decode.entries;
      out_.group_prefill[k].entries = out_.prefill.entries;
      for (step_tables* g : {&out_.group_decode[k], &out_.group_prefill[k]}) {
        if (const status st = export_group(*g, static_cast<std::int32_t>(k)); !st) {
          if (out_.error.ok()) out_.error = st;
          for (step_tables& t : out_.group_decode) t.clear();
          for (step_tables& t : out_.group_prefill) t.clear();
          break;
        }
      }
    }
    out_.decode.clear();
    out_.prefill.clear();
    return;
  }
  for (step_tables* g : {&out_.decode, &out_.prefill}) {
    if (const status st = export_group(*g); !st) {
      if (out_.error.ok()) out_.error = st;
      out_.decode.clear();
      out_.prefill.clear();
      return;
    }
  }
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::export_group(step_tables& g, std::int32_t kv_group) -> status {
  group_ids_.clear();
  g.qo_indptr.push_back(0);
  for (const std::int32_t i : g.entries) {
    const scheduled_sequence& e = out_.scheduled[static_cast<std::size_t>(i)];
    group_ids_.push_back(e.id);
    g.qo_indptr.push_back(g.qo_indptr.back() + e.num_tokens);
  }
  const auto csr_size = [&] {
    if constexpr (requires { cache_.num_groups(); }) {
      return cache_.csr_size(kv_group, group_ids_);
    } else {
      (void)kv_group;
      return cache_.csr_size(group_ids_);
    }
  };
  const result<std::int64_t> n = csr_size();
  if (!n) return n.error();
  g.kv_indptr.resize(g.entries.size() + 1);
  g.kv_indices.resize(static_cast<std::size_t>(*n));
  g.kv_last_page_len.resize(g.entries.size());
  status exported;
  if constexpr (requires { cache_.num_groups(); }) {
    exported = cache_.export_csr(kv_group, group_ids_, g.kv_indptr, g.kv_indices, g.kv_last_page_len);
  } else {
    exported = cache_.export_csr(group_ids_, g.kv_indptr, g.kv_indices, g.kv_last_page_len);
  }
  if (!exported) return exported;
  std::int32_t stride = 1;
  const std::int32_t bs = cache_.config().block_size;
  for (std::size_t i = 0; i < g.entries.size(); ++i) {
    const std::int32_t pages = g.kv_indptr[i + 1] - g.kv_indptr[i];
    stride = std::max(stride, pages);
    g.seq_lens.push_back((pages - 1) * bs + g.kv_last_page_len[i]);  // the cache's count, in its int32 range
  }
  g.row_stride = stride;
  g.block_table.assign(g.entries.size() * static_cast<std::size_t>(stride), no_block);
  for (std::size_t i = 0; i < g.entries.size(); ++i)
    std::copy(g.kv_indices.begin() + g.kv_indptr[i], g.kv_indices.begin() + g.kv_indptr[i + 1],
              g.block_table.begin() + static_cast<std::ptrdiff_t>(i * static_cast<std::size_t>(stride)));
  return ok_status();
}

template <class Cache>
auto scheduler<Cache>::preempt(seq_id victim) -> void {
  bool swapped = false;
  bool freed = false;
  errc refused = errc::unsupported;  // why the cache did not take the victim off the device itself
  if (cfg_.preemption == preemption_mode::cache_policy) {
    if (const auto d = cache_.preempt_decision(victim); d && *d == preempt_action::recompute) keep_hashes(victim);
    const auto a = cache_.preempt(victim);
    if (a) {
      swapped = *a == preempt_action::swap;
      freed = true;
    } else {
      refused = a.error().code();
    }
  } else if (tuners_.swaps(cfg_, limits_, reqs_.at_id(victim).computed)) {  // swap, or adaptive choosing it
    const status st = cache_.swap_out(victim);
    swapped = freed = st.ok();
    if (!st) refused = st.code();
  }
  if (!freed) {
    if (cfg_.preemption != preemption_mode::recompute && refused != errc::unsupported)
      ++stats_.swap_fallback_recompute;
    keep_hashes(victim);
    if (const status st = cache_.free_sequence(victim); !st) {
      fail(victim, st);  // gone from the cache behind the scheduler's back
      return;
    }
  }
  preempted_ = true;
  sched_request& r = reqs_.at_id(victim);
  erase_running(victim);
  if (swapped) {
    r.preempted = true;
    r.where = request_state::swapped;
    swapped_.push_back(victim);
    out_.swapped_out.push_back(victim);
    ++stats_.preempted_swap;
  } else {
    requeue(r);
    out_.preempted_recompute.push_back(victim);
    ++stats_.preempted_recompute;
  }
}

template <class Cache>
auto scheduler<Cache>::swap_in() -> void {
  while (!swapped_.empty() && occupied() < max_running_ && budget_ > 0) {
    const seq_id id = swapped_.front();
    const slot_type s = reqs_.find(id);
    if (const auto why = limit_reached(reqs_[s].num_tokens(), false)) {
      finish_with(id, *why);
      continue;
    }
    const auto need = cache_.swap_in_blocks(id);
    if (!need) {
      fail(id, need.error());
      continue;
    }
    const std::int64_t blocks = *need;
    if (cache_.available_blocks() - blocks < blocks_to_keep(blocks)) break;
    if (const status st = cache_.swap_in(id); !st) {
      if (st.code() == errc::out_of_blocks) break;
      fail(id, st);
      continue;
    }
    note_allocation();
    swapped_.pop_front();
    push_running(id, s);
    out_.swapped_in.push_back(id);
    ++stats_.swapped_in;
    compute(reqs_[s], s, false);
  }
}

template <class Cache>
auto scheduler<Cache>::admit() -> void {
  order_waiting(cfg_.order);
  while (!waiting_.empty() && budget_ > 0 && occupied() < max_running_)
    if (const admit_outcome a = admit_front(true); a == admit_outcome::stopped || a == admit_outcome::budget_stop)
      break;
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::plan_first_chunk(std::int64_t n, const prefix_match& m)
    const -> first_chunk {
  const std::int64_t uncached = n - m.tokens;
  const std::int64_t chunk = std::min(uncached, budget_);
  if (!cfg_.chunked_prefill && chunk < uncached) return {true, 0, 0};  // whole, in a later step
  // The first chunk ends at `end`: it takes the hit's blocks that consume capacity and blocks up to `end`.
  const std::int64_t end = m.tokens + chunk;
  return {false, end, m.blocks_to_allocate - cache_.blocks_needed(n) + cache_.blocks_needed(end)};
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::admit_front(bool count) -> admit_outcome {
  const seq_id id = waiting_.front();
  const slot_type s = reqs_.find(id);
  sched_request& r = reqs_[s];
  const std::int64_t n = r.num_tokens();
  if (const auto why = limit_reached(n, true)) {  // a recompute victim that grew past what can ever run
    finish_with(id, *why);
    return admit_outcome::removed;
  }
  // Two-phase where the lookup decides the budget or watermark test: match_prefix's hit is consumed by
  // add_sequence without a second lookup. Where neither test can fail (the whole request fits the budget, no
  // blocks to keep), add_sequence's own lookup is the only one.
  // A cache with KV cache groups always looks up first: its lookup hashes every full block (a window group's
  // lookup starts from the last one), and the request keeps the hashes for its next attempts.
  constexpr bool grouped = requires { cache_.num_groups(); };
  const bool must_match = grouped || n > budget_ || limits_.keeps_blocks(cfg_, running_.empty());
  if (must_match) {
    if (const status st = match_head(r); !st) {
      fail(id, st);
      return admit_outcome::removed;
    }
  }
  // External KV is not computed here: the first chunk starts after it, as after a hit.
  prefix_match planned = must_match ? hit_.match : no_match_;
  if (r.options.external_tokens > 0) {
    const std::int64_t bs = cache_.block_size();
    const std::int64_t ext = std::min<std::int64_t>(r.options.external_tokens, n - 1) / bs * bs;
    planned.tokens = static_cast<std::int32_t>(std::max<std::int64_t>(planned.tokens, ext));
  }
  const first_chunk fc = plan_first_chunk(n, planned);
  if (fc.budget_stop) {
    if (count) ++stats_.admit_budget_stop;
    return admit_outcome::budget_stop;
  }
  const std::int64_t end = fc.end, need = fc.need;
  if (must_match && cache_.available_blocks() - need < blocks_to_keep(need)) {  // LATER
    if (count) ++stats_.admit_fail;
    return admit_outcome::stopped;
  }
  prefix_match hit;
  const auto first = std::span<const token_id>(r.tokens).first(static_cast<std::size_t>(end));
  const status st = must_match ? cache_.add_sequence(id, first, r.options, hit_, &hit)
                               : cache_.add_sequence(id, first, r.options, &hit, r.block_hashes);
  if (!st) {
    if (st.code() == errc::out_of_blocks) {
      if (count) ++stats_.admit_fail;
      return admit_outcome::stopped;
    }
    fail(id, st);
    return admit_outcome::removed;
  }
  note_allocation();
  prefix_counters& c = r.preempted ? stats_.resumed_prefix : stats_.prefix;
  ++c.admissions;
  c.query_tokens += n;
  c.hit_tokens += hit.tokens;
  c.hit_blocks += hit.blocks;
  c.host_hit_tokens += std::int64_t{hit.host_blocks} * cache_.block_size();
  bool waits = false;  // asynchronous host tier loads or external KV: it waits for them, holding a running slot
  if constexpr (requires { cache_.complete_tier_transfers({}); }) {
    if (hit.host_blocks > 0 || hit.external_blocks > 0) {
      const auto ls = cache_.load_state(id);
      waits = ls && *ls == tier_load_state::loading;
    }
  }
  if (!waits) r.options.external_tokens = 0;  // nothing to wait for (its own cache had those blocks): used
  waiting_.pop_front();
  if (waits) {
    r.where = request_state::loading;
    loading_.push_back(id);
    r.computed = hit.tokens;
    if (hit.external_blocks > 0) {
      ++stats_.external_waits;
      out_.external.push_back(id);
    } else {
      ++stats_.load_waits;
    }
  } else {
    push_running(id, s);
  }
  r.prefilling = true;
  if (!cfg_.priority_preemption) r.aged = 0;  // with priority preemption a request keeps what it gained waiting
  r.waited = 0;
  ++stats_.admitted;
  if (!waits) record(r, s, hit.tokens, static_cast<std::int32_t>(end) - hit.tokens);
  return admit_outcome::admitted;
}

template <class Cache>
auto scheduler<Cache>::preempt_for_priority() -> void {
  if (!cfg_.priority_preemption || waiting_.empty() || running_.empty() || !swapped_.empty() || budget_ <= 0) return;
  order_waiting(cfg_.order);
  const seq_id head = waiting_.front();
  bool displaced = false;
  for (;;) {
    if (occupied() < max_running_) {
      if (!displaced) {
        if (head_fits()) return;  // no inversion to resolve: admitted in turn, after the running requests
      } else {
        if (admit_front(false) != admit_outcome::stopped) return;  // admitted, removed, or stopped by the budget
      }
    }
    const std::optional<seq_id> victim = priority_victim(reqs_.at_id(head).options.priority);
    if (!victim) return;
    preempt(*victim);
    ++stats_.preempted_for_priority;
    displaced = true;
    order_waiting(cfg_.order);  // a recompute victim went to the front: behind the head, which outranks it
    if (waiting_.front() != head) return;
  }
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::match_head(sched_request& r) -> status {
  const status st = cache_.match_prefix(r.tokens, r.options, hit_, r.block_hashes);
  if constexpr (requires { cache_.num_groups(); }) {
    if (st && hit_.known_hashes.size() > r.block_hashes.size()) r.block_hashes = hit_.known_hashes;
  }
  return st;
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::head_fits() -> bool {
  sched_request& r = reqs_.at_id(waiting_.front());
  const std::int64_t n = r.num_tokens();
  if (limit_reached(n, true)) return true;
  if (!match_head(r)) return true;  // admit() reports it
  const first_chunk fc = plan_first_chunk(n, hit_.match);
  return fc.budget_stop || cache_.available_blocks() - fc.need >= blocks_to_keep(fc.need);
}

template <class Cache>
KVPAGER_OUT_OF_LINE auto scheduler<Cache>::priority_victim(std::int32_t priority) const -> std::optional<seq_id> {
  std::optional<seq_id> best;
  std::int64_t best_priority = 0;
  for (std::size_t i = running_.size(); i-- > 0;) {  // newest first
    const sched_request& c = reqs_[running_slots_[i]];
    if (c.step == step_ || c.effective_priority() >= priority) continue;
    if (!best || c.effective_priority() < best_priority) {
      best = c.id;
      best_priority = c.effective_priority();
    }
  }
  return best;
}

template <class Cache>
auto scheduler<Cache>::finish_with(seq_id id, finish_reason why) -> void {
  out_.finished.push_back({id, why});
  ++stats_.finished_with_reason;
  (void)finish(id);
}

template <class Cache>
auto scheduler<Cache>::fail(seq_id id, status st) -> void {
  if (out_.error.ok()) out_.error = st;
  finish_with(id, finish_reason::cache_error);
}

KVPAGER_NAMESPACE_END

#if KVPAGER_EXTERN_COMPOSITIONS && KVPAGER_HAS_XXHASH
// The schedulers of the named compositions, compiled once in kvpager::compositions (core/config.hpp).
#include "kvpager/cache/compositions.hpp"
KVPAGER_NAMESPACE_BEGIN
extern template class scheduler<vllm_v1_cache>;
extern template class scheduler<hybrid_swap_cache>;
extern template class scheduler<host_swap_cache>;
extern template class scheduler<vllm_v1_no_caching_cache>;
extern template class scheduler<kv_groups_cache>;
extern template class scheduler<kv_groups_no_caching_cache>;
extern template class scheduler<kv_groups_swap_cache>;
KVPAGER_NAMESPACE_END
#endif
