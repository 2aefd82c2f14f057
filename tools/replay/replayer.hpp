// SPDX-License-Identifier: Apache-2.0
#pragma once
// kvtrace replayer: drives kvpager's public API exactly as an engine would (block_pool for pool-level traces,
// paged_kv_cache composed as vLLM v1 for manager-level ones) and reports vLLM-comparable counts and timings.

#include <kvpager/kvpager.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <new>
#include <span>
#include <string>
#include <unordered_map>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvtrace.hpp"

namespace kvreplay {

using json = nlohmann::ordered_json;

/// token(s, j) of the kvtrace format.
[[nodiscard]] inline kvpager::token_id token_of(std::uint64_t seed, std::uint64_t j) noexcept {
  std::uint64_t x = ((seed & 0xFFFFFFFFULL) << 32) | (j & 0xFFFFFFFFULL);
  x += 0x9E3779B97F4A7C15ULL;
  std::uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return static_cast<kvpager::token_id>((z ^ (z >> 31)) % 50000);
}

/// Safety limits for replaying untrusted traces (the fuzz test and `kvpager-replay --max-steps/--max-tokens` set
/// them); 0 = unlimited. Together they bound every loop of a replay: each `run` step and each token a request gets
/// is counted, and every other loop is bounded by the trace's size and params. Reaching one is an error naming the
/// op's line.
struct replay_limits {
  std::int64_t max_steps = 0;   ///< scheduler steps over all `run` ops
  std::int64_t max_tokens = 0;  ///< tokens given to requests: prompts (`req`), copies (`fork`), outputs (`decode`, `run`)
};

struct replay_result {
  json result;        // the "result" object
  std::string error;  // "FILE:LINE: message" on a trace error, a limit reached or memory exhausted
};

namespace detail {

[[nodiscard]] inline double round6(double x) { return std::round(x * 1e6) / 1e6; }

/// The params that size the cache, for messages about it: "num_blocks N, block_size B, prefix caching on".
[[nodiscard]] inline std::string cache_params(const trace& t) {
  std::string s = "num_blocks " + std::to_string(t.param("num_blocks", 0));
  if (t.level == "pool") return s;
  s += ", block_size " + std::to_string(t.param("block_size", 16)) + ", prefix caching " +
       (t.param("enable_caching", 1) != 0 ? "on" : "off");
  if (t.preemption != preemption_mode::recompute) s += ", num_host_blocks " + std::to_string(t.param("num_host_blocks", 0));
  return s;
}

/// "FILE:LINE: cannot create ... (params): why", LINE being `param num_blocks`'s (the cache is built from the header).
[[nodiscard]] inline std::string create_error(const trace& t, const std::string& name, const std::string& why) {
  return name + ":" + std::to_string(t.param_line("num_blocks")) + ": cannot create the " +
         (t.level == "pool" ? "block pool" : "cache") + " for " + cache_params(t) + ": " + why;
}

class stopwatch {
 public:
  stopwatch() : start_(std::chrono::steady_clock::now()) {}
  [[nodiscard]] double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// ------------------------------------------------------------------------------------------- pool level
/// `at_line`, when given, follows the op being replayed (for a report of memory exhaustion).
inline replay_result replay_pool(const trace& t, const std::string& name, std::int64_t* at_line = nullptr) {
  replay_result out;
  const auto num_blocks = static_cast<std::int32_t>(t.param("num_blocks", 0));
  auto created = kvpager::block_pool<kvpager::free_list_allocator>::create({num_blocks, 1});  // block 0 = null block
  if (!created) {
    out.error = create_error(t, name, created.error().message());
    return out;
  }
  auto& pool = *created;
  std::unordered_map<std::uint64_t, std::vector<kvpager::block_id>> slots;
  std::int64_t alloc_calls = 0, free_calls = 0, allocated = 0, freed = 0;
  std::int32_t peak_used = 0;
  const stopwatch clock;
  for (const op& o : t.ops) {
    if (at_line != nullptr) *at_line = o.line;
    if (o.kind == op_kind::alloc) {
      if (o.n > pool.num_free()) {
        out.error = name + ":" + std::to_string(o.line) + ": alloc of " + std::to_string(o.n) +
                    " blocks exceeds the free blocks (" + std::to_string(pool.num_free()) + ")";
        return out;
      }
      auto& blocks = slots[o.id];
      const std::size_t old = blocks.size();
      blocks.resize(old + static_cast<std::size_t>(o.n));
      (void)pool.allocate(std::span<kvpager::block_id>(blocks).subspan(old));  // capacity checked above
      ++alloc_calls;
      allocated += o.n;
      peak_used = std::max(peak_used, num_blocks - pool.num_free());
    } else {
      const auto it = slots.find(o.id);
      if (it == slots.end()) {
        out.error = name + ":" + std::to_string(o.line) + ": free of slot " + std::to_string(o.id) + ", never allocated";
        return out;
      }
      for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) (void)pool.release(*b);  // last allocated first
      freed += static_cast<std::int64_t>(it->second.size());
      it->second.clear();
      ++free_calls;
    }
  }
  const double elapsed = clock.seconds();
  const auto block_ops = static_cast<double>(allocated + freed);
  json& r = out.result;
  r["alloc_calls"] = alloc_calls;
  r["free_calls"] = free_calls;
  r["blocks_allocated"] = allocated;
  r["blocks_freed"] = freed;
  r["peak_used_blocks_incl_null"] = peak_used;
  r["final_free_blocks"] = pool.num_free();
  r["elapsed_s"] = elapsed;
  r["ns_per_block_op"] = block_ops > 0 ? elapsed * 1e9 / block_ops : 0.0;
  r["block_ops_per_s"] = elapsed > 0 ? block_ops / elapsed : 0.0;
  return out;
}

// ------------------------------------------------------------------------------------------- manager level
/// The scheduler configuration a manager-level trace asks for: vLLM v1's step (scheduler_config::vllm_v1(), as
/// docs/KVTRACE.md specifies "One run step") with the trace's budgets, watermark and preemption mode.
[[nodiscard]] inline kvpager::scheduler_config scheduler_config_for(const trace& t) {
  kvpager::scheduler_config c = kvpager::scheduler_config::vllm_v1();
  c.max_num_seqs = static_cast<std::int32_t>(std::min<std::int64_t>(t.param("max_num_seqs", 256), INT32_MAX));
  c.max_num_batched_tokens = t.param("max_num_batched_tokens", 8192);
  c.watermark_permille = static_cast<std::int32_t>(t.param("watermark_permille", 0));  // <= 1000 (parser)
  // swap: host_swap swaps while the host pool has room, else the scheduler recomputes (a counted fallback);
  // hybrid: hybrid_swap itself decides to recompute when the pool has no room.
  if (t.preemption != preemption_mode::recompute) c.preemption = kvpager::preemption_mode::cache_policy;
  c.export_slot_mapping = false;  // no kernel runs
  c.export_tables = false;
  return c;
}

/// Replays a manager-level trace: explicit ops (`admit`, `decode`, `finish`, `fork`) call the cache as vLLM's
/// KV-cache manager calls are made; `run` drives kvpager::scheduler, the one engines include, with the
/// scheduler_config_for the trace.
template <class Cache>
class manager_replay {
  static constexpr bool is_hybrid = requires(const Cache& c) { c.num_groups(); };

 public:
  /// `at_line`, when given, follows the op being replayed (for a report of memory exhaustion).
  manager_replay(const trace& t, const std::string& name, Cache cache, replay_limits limits,
                 std::int64_t* at_line = nullptr)
      : t_(t), name_(name), cache_(std::move(cache)), sched_(cache_, scheduler_config_for(t)), limits_(limits),
        at_line_(at_line), num_blocks_(static_cast<std::int32_t>(t.param("num_blocks", 0))) {}
  manager_replay(const manager_replay&) = delete;  // sched_ refers to cache_
  manager_replay& operator=(const manager_replay&) = delete;

  replay_result run() {
    const stopwatch clock;
    for (const op& o : t_.ops) {
      if (at_line_ != nullptr) *at_line_ = o.line;
      // An explicit op is the engine's own cache call, a step of its own: it starts from an executed plan. A 'run'
      // op's steps begin in schedule(), the step's one owner.
      if (o.kind != op_kind::run) cache_.begin_step();
      if (!apply(o)) return std::move(out_);
    }
    const double elapsed = clock.seconds();
    const kvpager::scheduler_stats ss = sched_.stats();
    const kvpager::cache_stats cs = cache_.stats();
    json& r = out_.result;
    // Explicit admissions are never resumed ones: a request admitted by 'admit' is not in the scheduler's queues.
    r["hit_blocks"] = explicit_.hit_blocks + ss.prefix.hit_blocks;
    r["hit_tokens"] = explicit_.hit_tokens + ss.prefix.hit_tokens;
    r["query_tokens"] = explicit_.query_tokens + ss.prefix.query_tokens;
    r["resumed_hit_blocks"] = ss.resumed_prefix.hit_blocks;
    r["resumed_hit_tokens"] = ss.resumed_prefix.hit_tokens;
    r["resumed_query_tokens"] = ss.resumed_prefix.query_tokens;
    r["prefix_cache_evictions"] = cs.evictions;
    const std::int64_t preemptions = ss.preempted_recompute + ss.preempted_swap;
    r["preemptions"] = preemptions;
    r["admit_fail"] = admit_fail_ + ss.admit_fail;
    r["admit_budget_stop"] = ss.admit_budget_stop;
    r["decode_alloc_fail"] = decode_alloc_fail_;
    r["steps"] = steps_;
    r["finished"] = finished_;
    if constexpr (is_hybrid) {
      // Group traces: the maximum right after every successful allocate_slots (KVTRACE.md), which the cache keeps.
      r["peak_usage"] = round6(double(cache_.peak_used_blocks()) / double(num_blocks_ - 1));
    } else {
      r["peak_usage"] = round6(double(std::max(peak_used_, ss.peak_used_blocks)) / double(num_blocks_ - 1));
    }
    r["final_usage"] = round6(double(used_blocks()) / double(num_blocks_ - 1));
    const std::int64_t q = explicit_.query_tokens + ss.prefix.query_tokens + ss.resumed_prefix.query_tokens;
    const std::int64_t h = explicit_.hit_tokens + ss.prefix.hit_tokens + ss.resumed_prefix.hit_tokens;
    r["hit_rate_tokens"] = q > 0 ? round6(double(h) / double(q)) : 0.0;
    r["run_stalled"] = stalled_;
    if (forks_ + fork_fail_ > 0) {
      r["forks"] = forks_;
      r["cow_copies"] = cs.cow_copies;
    }
    if (t_.preemption != preemption_mode::recompute || t_.has_param("num_host_blocks")) {
      r["swap_outs"] = ss.preempted_swap;
      r["swapped_out_blocks"] = cs.swapped_out_blocks;
      r["swap_ins"] = ss.swapped_in;
      r["swapped_in_blocks"] = cs.swapped_in_blocks;
      r["preempted_recompute"] = ss.preempted_recompute;
      r["swap_fallback_recompute"] = ss.swap_fallback_recompute;
    }
    if constexpr (is_hybrid) {
      json peak = json::array(), fin = json::array(), hit = json::array(), skipped = json::array();
      for (std::int32_t g = 0; g < cache_.num_groups(); ++g) {
        const kvpager::group_stats& gs = cache_.stats(g);
        peak.push_back(gs.peak_blocks);
        fin.push_back(gs.blocks);
        hit.push_back(gs.hit_blocks);
        skipped.push_back(gs.skipped_blocks);
      }
      r["group_peak_blocks"] = std::move(peak);
      r["group_final_blocks"] = std::move(fin);
      r["group_hit_blocks"] = std::move(hit);
      r["group_skipped_blocks"] = std::move(skipped);
    }
    r["elapsed_s"] = elapsed;
    if (!step_ms_.empty()) {
      std::vector<double> s = step_ms_;
      std::sort(s.begin(), s.end());
      double sum = 0;
      for (double x : s) sum += x;
      auto pct = [&](double p) { return s[std::min(s.size() - 1, static_cast<std::size_t>(p * double(s.size() - 1) + 0.5))]; };
      r["step_ms_mean"] = sum / double(s.size());
      r["step_ms_p50"] = pct(0.50);
      r["step_ms_p99"] = pct(0.99);
    }
    return std::move(out_);
  }

 private:
  /// defined: not admitted yet; live: admitted by 'admit' or 'fork' (explicit ops drive it); scheduled: handed
  /// to the scheduler by 'run' (waiting, running or swapped there until it finishes).
  enum class state { defined, live, scheduled, finished, failed };
  struct request {
    std::uint64_t id = 0;   // the trace's request id (in messages)
    kvpager::seq_id seq = 0;  // its id in the cache and the scheduler: its position in reqs_ (no lookup per step)
    std::uint64_t gen_seed = 0;
    std::int64_t max_new = 0;
    std::vector<kvpager::token_id> tokens;  // prompt, then every output token sampled so far (until 'run' takes it)
    std::int64_t computed = 0;              // tokens with KV slots (the cache's num_tokens), explicit ops
    std::int64_t outputs = 0;
    state st = state::defined;
  };
  struct prefix_counters {
    std::int64_t hit_blocks = 0, hit_tokens = 0, query_tokens = 0;
  };

  bool error(const op& o, const std::string& msg) {
    out_.error = name_ + ":" + std::to_string(o.line) + ": " + msg;
    return false;
  }

  /// Blocks in use: usable minus available (cached, unreferenced blocks count as free, as vLLM's usage).
  [[nodiscard]] std::int64_t used_blocks() const { return std::int64_t{num_blocks_ - 1} - cache_.available_blocks(); }
  void note_allocation() { peak_used_ = std::max(peak_used_, used_blocks()); }

  [[nodiscard]] kvpager::token_id next_token(request& r) {
    ++tokens_;
    return token_of(r.gen_seed, static_cast<std::uint64_t>(r.outputs++));
  }

  /// Whether the tokens given to requests so far are past replay_limits::max_tokens (then the error is set).
  bool over_token_limit(const op& o) {
    if (limits_.max_tokens <= 0 || tokens_ <= limits_.max_tokens) return false;
    error(o, "token limit reached (" + std::to_string(limits_.max_tokens) + " tokens)");
    return true;
  }

  const std::vector<kvpager::token_id>& segment_tokens(const segment& s) {
    auto& v = segments_[s.seed];
    for (auto j = static_cast<std::int64_t>(v.size()); j < s.len; ++j) v.push_back(token_of(s.seed, static_cast<std::uint64_t>(j)));
    return v;
  }

  request& request_of(std::uint64_t id) { return reqs_[static_cast<std::size_t>(index_.find(id))]; }

  /// Prefix lookup + allocation of the whole sequence. Returns false on a failed allocation (nothing changed).
  bool admit(request& r) {
    kvpager::prefix_match m;
    if (!cache_.add_sequence(r.seq, r.tokens, {}, &m)) return false;
    explicit_.hit_blocks += m.blocks;
    explicit_.hit_tokens += m.tokens;
    explicit_.query_tokens += static_cast<std::int64_t>(r.tokens.size());
    r.computed = static_cast<std::int64_t>(r.tokens.size());
    note_allocation();
    return true;
  }

  /// allocate_slots(r, 1) for a live request: its pending token gets a slot.
  bool extend(request& r) {
    const auto span = std::span<const kvpager::token_id>(r.tokens).subspan(static_cast<std::size_t>(r.computed), 1);
    if (!cache_.append_tokens(r.seq, span)) return false;
    ++r.computed;
    note_allocation();
    return true;
  }

  bool apply(const op& o) {
    switch (o.kind) {
      case op_kind::req: {
        request r;
        r.id = o.id;
        r.seq = reqs_.size();
        r.gen_seed = o.gen_seed;
        r.max_new = o.max_new;
        for (const segment& s : o.segments) {
          tokens_ += s.len;
          if (over_token_limit(o)) return false;
          const auto& v = segment_tokens(s);
          r.tokens.insert(r.tokens.end(), v.begin(), v.begin() + s.len);
        }
        index_.insert(r.id, static_cast<std::int32_t>(reqs_.size()));
        reqs_.push_back(std::move(r));
        return true;
      }
      case op_kind::admit: {
        request& r = request_of(o.id);
        if (r.st == state::live || (r.st == state::scheduled && sched_.state(r.seq) == kvpager::request_state::running))
          return error(o, "request " + std::to_string(o.id) + " is already live");
        if (r.st == state::scheduled && sched_.state(r.seq) == kvpager::request_state::waiting)
          return error(o, "request " + std::to_string(o.id) + " is queued by an earlier 'run'");
        if (r.st != state::defined) return true;  // failed, finished or swapped: a no-op
        if (!admit(r)) {
          ++admit_fail_;
          r.st = state::failed;
          return true;
        }
        r.tokens.push_back(next_token(r));
        r.st = state::live;
        return true;
      }
      case op_kind::decode: {
        request& r = request_of(o.id);
        if (r.st == state::scheduled && sched_.state(r.seq) == kvpager::request_state::running)
          return decode_running(o, r);
        if (r.st != state::live) return true;
        for (std::int64_t i = 0; i < o.n; ++i) {
          // Each token is its own engine step (its own allocate_slots in vLLM): a window group's release follows
          // the computed tokens.
          if constexpr (is_hybrid) {
            if (i > 0) cache_.begin_step();
          }
          if (!extend(r)) {
            ++decode_alloc_fail_;
            break;
          }
          r.tokens.push_back(next_token(r));
          if (over_token_limit(o)) return false;
        }
        return true;
      }
      case op_kind::finish: {
        request& r = request_of(o.id);
        if (r.st == state::live) {
          (void)cache_.free_sequence(r.seq);
        } else if (r.st != state::scheduled || sched_.state(r.seq) != kvpager::request_state::running ||
                   !sched_.finish(r.seq)) {
          return true;  // not live: a no-op
        }
        r.st = state::finished;
        return true;
      }
      case op_kind::run:
        return run_steps(o);
      case op_kind::fork: {
        request& p = request_of(o.id);
        if (p.st != state::live) return error(o, "fork: request " + std::to_string(o.id) + " is not live (admit it first)");
        tokens_ += static_cast<std::int64_t>(p.tokens.size());
        if (over_token_limit(o)) return false;
        const kvpager::seq_id child = reqs_.size();
        const bool forked = cache_.fork(p.seq, child).ok();
        request c = p;  // same tokens (its pending token too) and the parent's blocks, shared
        c.id = o.child;
        c.seq = child;
        c.gen_seed = o.gen_seed;
        // A failed fork still defines the child (the parser let later ops name it): failed, so they are no-ops.
        if (!forked) c.st = state::failed;
        index_.insert(c.id, static_cast<std::int32_t>(reqs_.size()));
        reqs_.push_back(std::move(c));
        ++(forked ? forks_ : fork_fail_);
        return true;
      }
      default:
        return error(o, "pool-level op in a manager-level trace");
    }
  }

  /// 'decode' on a request the scheduler runs: its pending token is computed now, and it samples the next one.
  bool decode_running(const op& o, request& r) {
    for (std::int64_t i = 0; i < o.n; ++i) {
      if constexpr (is_hybrid) {
        if (i > 0) cache_.begin_step();  // each token its own step, as in 'decode' on a live request
      }
      if (!sched_.compute_pending(r.seq)) {
        ++decode_alloc_fail_;
        break;
      }
      (void)sched_.complete(r.seq, next_token(r));  // every token computed: it takes its next one
      if (over_token_limit(o)) return false;
    }
    return true;
  }

  [[nodiscard]] bool scheduler_holds_requests() const {
    return !sched_.running().empty() || !sched_.waiting().empty() || !sched_.swapped().empty();
  }

  bool run_steps(const op& o) {
    const std::int64_t max_steps = o.n;
    // Every request never admitted joins the waiting queue, in definition order; the scheduler keeps its tokens.
    for (request& r : reqs_) {
      if (r.st != state::defined) continue;
      if (const auto a = sched_.add_request(r.seq, r.tokens); !a)
        return error(o, "run: the scheduler refused request " + std::to_string(r.id) + ": " + a.error().message());
      r.st = state::scheduled;
      std::vector<kvpager::token_id>().swap(r.tokens);
    }
    // An unbounded run must end: every request the scheduler holds, in whichever queue (waiting, preempted,
    // running, swapped), needs a finite max_new. With one, each step that schedules anything brings a request
    // closer to finishing, and a step that schedules and preempts nothing ends the run (run_stalled).
    if (max_steps == 0)
      for (const request& r : reqs_)
        if (r.st == state::scheduled && r.max_new == 0)
          return error(o, "'run 0' with request " + std::to_string(r.id) + " whose max_new is 0 never ends");
    for (std::int64_t step = 0; (max_steps == 0 || step < max_steps) && scheduler_holds_requests(); ++step) {
      if (limits_.max_steps > 0 && steps_ >= limits_.max_steps)
        return error(o, "step limit reached (" + std::to_string(limits_.max_steps) + " steps)");
      const stopwatch clock;
      const bool progressed = schedule_step();
      ++steps_;
      step_ms_.push_back(clock.seconds() * 1e3);
      if (over_token_limit(o)) return false;
      if (!progressed) {
        stalled_ = true;
        return true;
      }
    }
    return true;
  }

  /// One scheduler step (KVTRACE.md "One run step"), then the engine's part: the plan is executed, each scheduled
  /// request samples its next token, and those at max_new are finished, in scheduled order. Returns whether
  /// anything was scheduled, preempted or finished.
  bool schedule_step() {
    const kvpager::step_output& out = sched_.schedule();  // the engine executes the plan; the next schedule() or op ends it
    for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
      const kvpager::scheduled_sequence& s = out.scheduled[i];
      if (!s.last_chunk) continue;
      request& r = reqs_[static_cast<std::size_t>(s.id)];
      const kvpager::token_id next = next_token(r);
      const bool done = r.max_new > 0 && r.outputs >= r.max_new;
      (void)sched_.complete_scheduled(i, next, done);  // a scheduled request waits for exactly this token
      if (done) {
        r.st = state::finished;
        ++finished_;
      }
    }
    for (const kvpager::finished_request& f : out.finished) reqs_[static_cast<std::size_t>(f.id)].st = state::failed;
    return !out.scheduled.empty() || !out.preempted_recompute.empty() || !out.swapped_out.empty() ||
           !out.finished.empty();
  }

  const trace& t_;
  std::string name_;
  Cache cache_;
  kvpager::scheduler<Cache> sched_;
  replay_limits limits_;
  std::int64_t* at_line_;
  std::int32_t num_blocks_;
  std::vector<request> reqs_;
  kvpager::id_map index_;  ///< request id -> position in reqs_
  std::unordered_map<std::uint64_t, std::vector<kvpager::token_id>> segments_;
  prefix_counters explicit_;  ///< admissions by explicit 'admit' ops ('run' admissions: the scheduler's stats)
  std::int64_t admit_fail_ = 0, decode_alloc_fail_ = 0;  ///< of explicit ops
  std::int64_t steps_ = 0, finished_ = 0;
  std::int64_t tokens_ = 0;  ///< tokens given to requests (replay_limits::max_tokens)
  std::int64_t peak_used_ = 0;  ///< blocks in use after explicit ops' allocations (the scheduler tracks its own)
  bool stalled_ = false;
  std::int64_t forks_ = 0, fork_fail_ = 0;
  std::vector<double> step_ms_;
  replay_result out_;
};

/// Replays a manager-level trace over `Cache`. A cache that cannot be created for the params (`create` answers an
/// error) is reported at the `param num_blocks` line; `at_line`, when given, follows the op being replayed.
template <class Cache>
replay_result replay_manager(const trace& t, const std::string& name, replay_limits limits,
                             std::int64_t* at_line = nullptr) {
  std::int32_t host_blocks = 0;
  if constexpr (!std::is_same_v<typename Cache::swap_policy_type, kvpager::no_swap>)
    host_blocks = static_cast<std::int32_t>(t.param("num_host_blocks", 0));
  auto created = Cache::create({static_cast<std::int32_t>(t.param("block_size", 16)),
                                static_cast<std::int32_t>(t.param("num_blocks", 0)), /*reserved (null block)=*/1, 0,
                                host_blocks});
  if (!created) return replay_result{json::object(), create_error(t, name, created.error().message())};
  return manager_replay<Cache>(t, name, std::move(*created), limits, at_line).run();
}

/// The group kinds of a trace's `group` records, in group order.
[[nodiscard]] inline std::vector<kvpager::any_group_kind> group_kinds(const trace& t) {
  std::vector<kvpager::any_group_kind> kinds;
  for (const group_record& g : t.groups) {
    if (g.kind == "sliding_window") {
      kinds.emplace_back(kvpager::sliding_window{g.size});
    } else if (g.kind == "chunked_local") {
      kinds.emplace_back(kvpager::chunked_local{g.size});
    } else {
      kinds.emplace_back(kvpager::full_attention{});
    }
  }
  return kinds;
}

/// Replays a trace with `group` records over hybrid cache `Cache` in vLLM's conventions.
template <class Cache>
replay_result replay_hybrid(const trace& t, const std::string& name, replay_limits limits, std::int64_t* at_line) {
  if (t.preemption != preemption_mode::recompute)
    return replay_result{json::object(), name + ":" + std::to_string(t.param_line("preemption")) +
                                             ": 'param preemption swap|hybrid' with 'group' records: hybrid caches "
                                             "preempt by recompute (vLLM's only mode)"};
  const std::vector<kvpager::any_group_kind> kinds = group_kinds(t);
  auto created = Cache::create({static_cast<std::int32_t>(t.param("block_size", 16)),
                                static_cast<std::int32_t>(t.param("num_blocks", 0)), /*reserved (null block)=*/1},
                               kinds, {kvpager::hybrid_conventions::vllm});
  if (!created) return replay_result{json::object(), create_error(t, name, created.error().message())};
  return manager_replay<Cache>(t, name, std::move(*created), limits, at_line).run();
}

}  // namespace detail

/// The composition kvpager-replay uses for `enable_caching 0`: vLLM's free queue without prefix caching.
using kvpager::vllm_v1_no_caching_cache;

namespace detail {
template <class W>
replay_result replay_with_swap(const trace& t, const std::string& name, replay_limits limits, std::int64_t* at_line) {
  using namespace kvpager;
  if (t.param("enable_caching", 1) != 0) return replay_manager<vllm_v1_cache_with<W>>(t, name, limits, at_line);
  return replay_manager<no_caching_cache_with<W>>(t, name, limits, at_line);
}

/// Replays `t` over the composition its params name (no catch; see replay_guarded).
inline replay_result replay_any(const trace& t, const std::string& name, replay_limits limits, std::int64_t* at_line) {
  if (t.level == "pool") return replay_pool(t, name, at_line);
  if (!t.groups.empty()) {
    if (t.param("enable_caching", 1) != 0) return replay_hybrid<kvpager::kv_groups_cache>(t, name, limits, at_line);
    return replay_hybrid<kvpager::kv_groups_no_caching_cache>(t, name, limits, at_line);
  }
  switch (t.preemption) {
    case preemption_mode::swap: return replay_with_swap<kvpager::host_swap>(t, name, limits, at_line);
    case preemption_mode::hybrid: return replay_with_swap<kvpager::hybrid_swap>(t, name, limits, at_line);
    default: break;
  }
  if (t.param("enable_caching", 1) != 0) return replay_manager<kvpager::vllm_v1_cache>(t, name, limits, at_line);
  return replay_manager<vllm_v1_no_caching_cache>(t, name, limits, at_line);
}

/// Runs `replay_fn(&at_line)` (which sets at_line to each op's line as it replays it) and turns memory exhaustion
/// (std::bad_alloc) into an error naming the line: the `param num_blocks` line while the cache is being created
/// (before the first op), else the op's. The catch is here, in the tool: the library's calls do not throw it
/// (`create` answers an error instead), but the tool must not abort whatever they answer. Under -fno-exceptions
/// nothing is caught.
template <class F>
replay_result replay_guarded(const trace& t, const std::string& name, F&& replay_fn) {
  const std::int64_t params_line = t.param_line("num_blocks");
  std::int64_t at_line = params_line;
#if KVPAGER_HAS_EXCEPTIONS
  try {
    return std::forward<F>(replay_fn)(&at_line);
  } catch (const std::bad_alloc&) {
    const std::string why = "out of memory (std::bad_alloc)";
    return replay_result{json::object(), at_line == params_line
                                             ? create_error(t, name, why)
                                             : name + ":" + std::to_string(at_line) + ": " + why + " replaying this op"};
  }
#else
  (void)name;
  return std::forward<F>(replay_fn)(&at_line);
#endif
}

}  // namespace detail

/// Replays one parsed trace. Counts are deterministic; elapsed times are measured around the ops. Returns the
/// result, or an error "FILE:LINE: message" for a trace error, a limit reached, a cache that cannot be created for
/// the params (at `param num_blocks`'s line, whatever `create` answers: an error or std::bad_alloc) or memory
/// exhausted during an op (at its line).
inline replay_result replay(const trace& t, const std::string& name, replay_limits limits = {}) {
  return detail::replay_guarded(t, name, [&](std::int64_t* at_line) { return detail::replay_any(t, name, limits, at_line); });
}

/// The JSON entry kvpager-replay prints for a replayed trace: workload, level, params as written, op count and
/// `result`. Every string in it was checked to be UTF-8 by parse_kvtrace, so dumping it does not throw.
[[nodiscard]] inline json workload_entry(const trace& t, json result) {
  json w;
  w["workload"] = t.workload;
  w["level"] = t.level;
  w["params"] = json::object();
  for (const auto& [key, value] : t.raw_params) {
    std::int64_t v = 0;
    if (detail::parse_uint(value, v)) {
      w["params"][key] = v;
    } else {
      w["params"][key] = value;
    }
  }
  w["ops"] = t.ops.size();
  if (!t.groups.empty()) {
    w["groups"] = json::array();
    for (const group_record& g : t.groups) w["groups"].push_back(g.text);
  }
  w["result"] = std::move(result);
  return w;
}

}  // namespace kvreplay
