// SPDX-License-Identifier: Apache-2.0
// Liveness and content of the scheduler over a paged KV cache with an asynchronous host tier
// (host_tier_options::async): randomized serving runs over tiered_cache_with<lru_tier | arc_tier, hybrid_swap> with
// prefix caching, checked against a model of every request's tokens and emulated KV bytes.
//
// The workload reuses prefixes across time: "conversation" families (a shared prefix of several blocks under the
// family's extra key, then a random suffix) come back after other traffic pushed their blocks out of a small device
// pool, so the host tier serves hits. Chunked prefill under a small token budget, generated tokens determined by
// (request id, position), preemption by swap (hybrid_swap, a small swap pool) or recompute.
//
// The emulated engine executes each step's plan (swap-outs, swap-ins, copies, then the appended tokens' K/V through the
// slot mapping; a token's value is a rolling hash of the extra key and every token up to it, kvtest::mix, so a block's
// bytes name its content). Preemption swaps (host blocks below num_host_blocks) run in the step; host tier transfers
// complete later: each is delivered after a random delay (0 to a few steps; some loads and stores are "stuck" past
// load_timeout_steps, so the timeout and orphaned-block paths run), some fail, and the due ones are reported in random
// order and random batches through complete_tier_transfers. A load copies host -> device when it is reported (garbage
// when it failed); a write-through store copies its (pinned) source device block when it is reported, a write-back
// store when the plan runs; a failed store leaves garbage in its host block.
//
// After every schedule(): no request is in two queues; running ones are in the cache and not swapped, swapped ones
// swapped, waiting ones not in it, loading ones in it with tier_load_state::loading and the tokens the scheduler counts
// as computed; no request with loads pending is scheduled; no more than max_num_seqs requests run or are scheduled;
// each scheduled sequence's tokens are its slot-mapping entries, in order, on its block table; a load reads a host
// block whose last store was reported ok, no host block has two transfers in flight, and no device block being loaded
// is written, copied, swapped or loaded into. After every step: every running request's computed tokens, read back
// through its block table, are the model's (so no request was computed before its loads arrived, and no failed load,
// failed store or reused pinned block was ever read), swapped requests' likewise through their host tables;
// tier_load_state is loading or failed only for loading requests; the pool's accounting adds up; the cache's and the
// tier's in-flight counts are the engine's undelivered transfers.
//
// Bad reports (no such transfer, one listed twice, a load with the wrong device block, a swap-pool or out-of-range host
// block) are errc::invalid_argument and change nothing; appends, forks, swap-outs and preemptions of a sequence waiting
// for its loads are errc::pending_append and change nothing, and the scheduler refuses a token, a fork or
// compute_pending for a loading request. Requests finish at their max tokens; a few are cancelled while loading (the
// device blocks of their loads in flight stay held until reported), and a few elsewhere. Arrivals stop after a number
// of steps; then every request must end (finished by the engine or by the scheduler with a reason, cancelled, or
// rejected) within a bound, and with every transfer delivered nothing leaks: no block used, none in flight, the tier
// neither reading nor writing. Each configuration checks that the paths ran: waits for loads, load failures, failed
// loads and stores, timeouts, host prefix hits, cancels with loads in flight, swap and recompute preemptions.
//
// The same runs drive a hybrid_kv_cache with KV cache groups (groups_tiered_cache_with: full attention and a sliding
// window of 2 blocks + 1 token, native or vLLM conventions): the emulated engine keeps one memory plane per group's
// layers (device and host), writes each token through its group's slot mapping (the step's slot mapping is
// table-major) with the token's value mixed with the group, and moves a swap's or copy's bytes in the plane of the
// group it names; so a block loaded, swapped or copied into the wrong group, or a swap naming the wrong group, is
// read back wrong. Each group's table is checked: the null block (0, never moved, never written) only where the
// group no longer reads (before a window), never in a slot of the step, nor as a swap's or copy's block (host
// block 0 of the swap pool is reserved as well); a load reads a host block stored from its own group, a swap-in a
// swap-pool block swapped out from its own group.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "support/cache_snapshot.hpp"
#include "support/kv_content.hpp"

using namespace kvpager;

namespace {

// Runs per configuration (each drawing its pool size, budget, batch, delays, preemption mode and victim order), each
// with arrivals for arrival_steps steps, then the drain.
#if defined(KVPAGER_TEST_REDUCED)
constexpr int runs_per_config = 30;  // sanitizer and no-exception presets: 10x fewer steps, same shapes
#else
constexpr int runs_per_config = 300;
#endif
constexpr int arrival_steps = 2500;

using kvtest::mix;

/// One configuration of the cache under test.
struct tier_case {
  std::int32_t device_blocks = 32;
  std::int32_t tier_blocks = 32;
  std::int32_t swap_blocks = 12;
  tier_write write = tier_write::through;
  bool inclusive = true;
  std::int32_t timeout = 6;  ///< load_timeout_steps
  std::uint32_t seed = 1;
  hybrid_conventions conv = hybrid_conventions::native;  ///< a cache with KV cache groups: its conventions
};

/// What became of a submitted request.
enum class fate { pending, finished, finished_with_reason, rejected, cancelled };

struct request_model {
  std::vector<token_id> tokens;
  std::vector<std::uint64_t> values;  ///< the emulated K/V of each position
  std::uint64_t extra = 0;
  std::int32_t max_out = 0;
  std::int32_t generated = 0;
  fate f = fate::pending;
};

/// A host tier transfer the engine has not reported yet.
struct transfer {
  tier_done done;        ///< the plan's entry, with the outcome the engine will report
  bool load = false;
  std::int64_t due = 0;  ///< the engine step from which it is reported
};

/// Counters summed over a configuration's runs.
struct totals {
  std::int64_t steps = 0, requests = 0, load_waits = 0, load_failures = 0, failed_loads = 0, failed_stores = 0,
               timeouts = 0, host_hit_tokens = 0, loaded = 0, stored = 0, cancelled_loading = 0, orphaned_loads = 0,
               preempted_swap = 0, preempted_recompute = 0, finished_with_reason = 0, rejected = 0, bad_calls = 0,
               max_in_flight = 0, max_waiting = 0, max_drain = 0, over_max_seqs = 0;
  double bound_ratio = 0;
  std::string first_over_max_seqs;
};

template <class Cache>
class tier_async_run {
  /// A cache with KV cache groups (hybrid_kv_cache): a block table and a slot mapping per group, swaps and copies
  /// naming their group, the null block in a window group's table before its window.
  static constexpr bool grouped = requires(const Cache& c) { c.num_groups(); };

 public:
  tier_async_run(const tier_case& c, std::uint32_t seed) : case_(c), rng_(seed) {
    // Per run: the pool a few blocks either way, the token budget, the batch, the transfers' usual delay, the
    // preemption mode and victim order.
    ccfg_ = cache_config{block_size, c.device_blocks - 4 + pick(9), 1, 0, c.swap_blocks};
    ccfg_.host_tier = {.num_blocks = c.tier_blocks,
                       .write = c.write,
                       .inclusive = c.inclusive,
                       .async = true,
                       .load_timeout_steps = c.timeout};
    cfg_.max_num_seqs = 4 + pick(5);
    cfg_.max_num_batched_tokens = 10 + pick(17);
    max_delay_ = 1 + pick(4);
    cfg_.chunked_prefill = true;
    cfg_.export_slot_mapping = true;
    cfg_.export_tables = false;
    // hybrid_swap: swap while the swap pool has room, else recompute; or always recompute.
    cfg_.preemption = pick(3) == 0 ? preemption_mode::recompute : preemption_mode::cache_policy;
    cfg_.victim = pick(2) == 0 ? preemption_order::newest_first : preemption_order::lowest_priority;
    // Families: a prefix of 4 to 7 blocks each, half of them under an extra key.
    for (std::int32_t f = 0; f < num_families; ++f) {
      std::vector<token_id> p;
      const std::int32_t blocks = 4 + pick(4);
      for (std::int32_t t = 0; t < blocks * block_size; ++t) p.push_back(1000 * (f + 1) + t);
      families_.push_back(std::move(p));
    }
  }

  void run(totals& tot) {
    auto made = create();
    ASSERT_TRUE(made) << made.error().message();
    Cache cache = std::move(*made);
    cache_ = &cache;
    scheduler<Cache> s(cache, cfg_);
    sched_ = &s;
    nh_ = ccfg_.num_host_blocks;
    tables_ = scheduler<Cache>::groups_of(cache);
    ASSERT_EQ(tables_, grouped ? 2 : 1);
    const auto planes = static_cast<std::size_t>(tables_);
    mem_.assign(planes, std::vector<std::uint64_t>(static_cast<std::size_t>(ccfg_.num_blocks) * block_size, 0));
    host_mem_.assign(planes,
                     std::vector<std::uint64_t>(static_cast<std::size_t>(ccfg_.host_pool_blocks()) * block_size, 0));
    host_valid_.assign(static_cast<std::size_t>(case_.tier_blocks), 0);
    host_group_.assign(static_cast<std::size_t>(ccfg_.host_pool_blocks()), -1);
    // A prompt takes its blocks in every table at admission: longer than this it can never run.
    usable_tokens_ = std::int64_t{cache.stats().total} / tables_ * block_size;

    std::int64_t bound = 0;
    for (step_ = 0;; ++step_) {
      if (step_ < arrival_steps) arrivals();
      if (::testing::Test::HasFatalFailure()) return;
      bound = arrival_steps + 1000 + 50 * work_;
      if (step_ >= arrival_steps && unsettled() == 0 && inflight_.empty() && cache.stats().tier_in_flight == 0)
        break;
      ASSERT_LT(step_, bound) << describe() << ": " << unsettled() << " requests unsettled (waiting "
                              << s.stats().waiting << ", running " << s.stats().running << ", swapped "
                              << s.stats().swapped << ", loading " << s.stats().loading << "), "
                              << inflight_.size() << " transfers undelivered";
      one_step(step_ < arrival_steps);
      if (::testing::Test::HasFatalFailure()) return;
    }
    // Settle: steps with nothing to schedule until no transfer is planned (write-through stores of the last blocks
    // cached), every one delivered at once.
    for (int k = 0; k < 8; ++k) {
      const step_output& out = s.schedule();
      ASSERT_TRUE(out.error.ok()) << out.error.message();
      ASSERT_TRUE(out.scheduled.empty());
      const bool moved = !cache.plan().swap_outs().empty() || !cache.plan().swap_ins().empty();
      execute(out);
      if (::testing::Test::HasFatalFailure()) return;
      deliver(true);
      if (::testing::Test::HasFatalFailure()) return;
      if (!moved) break;
    }
    const scheduler_stats st = s.stats();
    EXPECT_EQ(st.waiting + st.running + st.swapped + st.loading, 0) << describe();
    EXPECT_TRUE(s.loading().empty());
    const cache_stats cs = cache.stats();
    EXPECT_EQ(cs.tier_in_flight, 0) << describe();
    EXPECT_EQ(cs.used, 0) << describe() << ": a block leaked";
    EXPECT_EQ(cs.pending_free, 0);
    EXPECT_EQ(cs.free + cs.evictable, cs.total) << describe();
    EXPECT_EQ(cs.sequences, 0);
    EXPECT_EQ(cs.host_free, cs.host_total) << "a swap pool block leaked";
    const host_tier_stats ts = cache.tier().stats();
    EXPECT_EQ(ts.reading, 0) << describe();
    EXPECT_EQ(ts.writing, 0) << describe();
    EXPECT_LE(ts.held, ts.num_blocks);
    EXPECT_EQ(cs.tier_failed_stores, ts.failed_stores);
    EXPECT_EQ(cs.tier_loaded_blocks, ts.loads);
    if constexpr (grouped) {
      // The host hit is the agreed hit past the device's own, in tokens; its blocks are loaded per group (every one
      // for full attention, a window's last ones only), so there is a load exactly when there is a host hit.
      EXPECT_EQ(cs.prefix_hit_tokens_host % block_size, 0);
      EXPECT_EQ(cs.prefix_hit_tokens_host > 0, cs.tier_loaded_blocks > 0) << describe();
    } else {
      EXPECT_EQ(cs.prefix_hit_tokens_host, cs.tier_loaded_blocks * block_size);
    }
    EXPECT_LE(st.load_failures, st.load_waits);
    for (const auto& [id, r] : model_) EXPECT_NE(r.f, fate::pending) << "request " << id;
    if (std::getenv("KVPAGER_LIVENESS_VERBOSE") != nullptr)
      std::printf("%s: %zu requests, %lld work, %lld steps (bound %lld)\n", describe().c_str(), model_.size(),
                  static_cast<long long>(work_), static_cast<long long>(step_), static_cast<long long>(bound));

    tot.steps += step_;
    tot.requests += static_cast<std::int64_t>(model_.size());
    tot.bound_ratio = std::max(tot.bound_ratio, double(step_) / double(bound));
    tot.load_waits += st.load_waits;
    tot.load_failures += st.load_failures;
    tot.failed_loads += cs.tier_failed_loads;
    tot.failed_stores += cs.tier_failed_stores;
    tot.timeouts += cs.tier_load_timeouts;
    tot.host_hit_tokens += cs.prefix_hit_tokens_host;
    tot.loaded += cs.tier_loaded_blocks;
    tot.stored += cs.tier_stored_blocks;
    tot.cancelled_loading += cancelled_loading_;
    tot.orphaned_loads += orphaned_loads_;
    tot.preempted_swap += st.preempted_swap;
    tot.preempted_recompute += st.preempted_recompute;
    tot.finished_with_reason += st.finished_with_reason;
    tot.rejected += st.rejected;
    tot.bad_calls += bad_calls_;
    tot.max_in_flight = std::max(tot.max_in_flight, max_in_flight_);
    tot.max_waiting = std::max(tot.max_waiting, max_waiting_);
    tot.max_drain = std::max(tot.max_drain, step_ - arrival_steps);
    if (tot.over_max_seqs == 0) tot.first_over_max_seqs = first_over_max_seqs_;
    tot.over_max_seqs += over_max_seqs_;
  }

 private:
  static constexpr std::int32_t block_size = 4;
  static constexpr std::int32_t num_families = 12;

  std::int32_t pick(std::int32_t n) { return static_cast<std::int32_t>(rng_() % static_cast<std::uint32_t>(n)); }

  result<Cache> create() const {
    if constexpr (grouped) {
      const any_group_kind groups[] = {full_attention{}, sliding_window{2 * block_size + 1}};
      return Cache::create(ccfg_, std::span<const any_group_kind>(groups), hybrid_options{case_.conv});
    } else {
      return Cache::create(ccfg_);
    }
  }

  /// Table t (a KV cache group; 0 without groups) of live sequence `id`, on the device or (swapped) on the host.
  std::span<const block_id> table(std::int32_t t, seq_id id) const {
    if constexpr (grouped) {
      return *cache_->block_table(t, id);
    } else {
      return *cache_->block_table(id);
    }
  }
  std::span<const block_id> host_table(std::int32_t t, seq_id id) const {
    if constexpr (grouped) {
      return *cache_->host_block_table(t, id);
    } else {
      return *cache_->host_block_table(id);
    }
  }
  /// Tokens table t no longer reads once a sequence has `n` computed: those before a window group's window, where
  /// its table may hold the null block; none for full attention and without groups.
  std::int64_t skipped(std::int32_t t, std::int64_t n) const {
    if constexpr (grouped) {
      return cache_->kind(t).skipped_tokens(n);
    } else {
      (void)t;
      (void)n;
      return 0;
    }
  }
  /// Table t's emulated K/V of a token whose value is v (group 0's and the only table's: v itself).
  static std::uint64_t gv(std::uint64_t v, std::int32_t t) {
    return t == 0 ? v : mix(v, 77 + static_cast<std::uint64_t>(t));
  }

  std::string describe() const {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "%sdevice %d tier %d swap pool %d write %s %s timeout %d delay %d budget %lld seqs %d mode %d "
                  "victim %d seed %u step %lld",
                  !grouped                                   ? ""
                  : case_.conv == hybrid_conventions::native ? "groups native: "
                                                             : "groups vllm: ",
                  ccfg_.num_blocks, case_.tier_blocks, case_.swap_blocks,
                  case_.write == tier_write::through ? "through" : "back", case_.inclusive ? "inclusive" : "exclusive",
                  case_.timeout, max_delay_, static_cast<long long>(cfg_.max_num_batched_tokens), cfg_.max_num_seqs,
                  static_cast<int>(cfg_.preemption), static_cast<int>(cfg_.victim), case_.seed,
                  static_cast<long long>(step_));
    return buf;
  }

  /// Request `m`, pending until now, ended as `f`.
  void end(request_model& m, fate f) {
    m.f = f;
    --pending_;
  }

  std::int64_t unsettled() const { return pending_; }

  /// The token a request samples at position `pos`: a function of (id, pos) only.
  static token_id generated_token(seq_id id, std::size_t pos) {
    return static_cast<token_id>(mix(id * 0x9E37U + 11, pos) % 50);
  }

  static void push_token(request_model& m, token_id t) {
    const std::uint64_t prev = m.values.empty() ? mix(0x1234, m.extra) : m.values.back();
    m.tokens.push_back(t);
    m.values.push_back(mix(prev, static_cast<std::uint64_t>(t) + 1));
  }

  std::uint64_t garbage() { return (std::uint64_t{rng_()} << 32 | rng_()) | 1; }

  /// Arrivals: mostly the current hot families (the window moves on every 30 steps and comes back after the other
  /// families and one-off traffic pushed their blocks out of the device pool), some one-off prompts, a few that can
  /// never fit.
  void arrivals() {
    const std::int32_t k = pick(2);
    for (std::int32_t i = 0; i < k; ++i) {
      const seq_id id = next_id_++;
      request_model m;
      const std::int32_t kind = pick(100);
      if (kind == 0) {  // longer than the whole cache: rejected
        for (std::int64_t t = 0; t < usable_tokens_ + 1 + pick(8); ++t) push_token(m, pick(50));
      } else if (kind < 40) {  // one-off traffic
        const std::int32_t n = 8 + pick(20);
        for (std::int32_t t = 0; t < n; ++t) push_token(m, 100 + pick(800));
      } else {
        const std::int32_t phase = static_cast<std::int32_t>(step_ / 30);
        const std::int32_t f = (phase * 3 + pick(3)) % num_families;
        m.extra = f % 2 == 0 ? 0 : 77 + static_cast<std::uint64_t>(f);
        const auto& prefix = families_[static_cast<std::size_t>(f)];
        // The whole prefix mostly, sometimes cut at a block boundary (at least two blocks).
        const auto blocks = static_cast<std::int32_t>(prefix.size()) / block_size;
        const std::int32_t cut = pick(4) == 0 ? 2 + pick(blocks - 1) : blocks;
        for (std::int32_t t = 0; t < cut * block_size; ++t) push_token(m, prefix[static_cast<std::size_t>(t)]);
        const std::int32_t suffix = pick(5) == 0 ? 0 : 1 + pick(6);  // none: the last block is computed anyway
        for (std::int32_t t = 0; t < suffix; ++t) push_token(m, pick(50));
      }
      m.max_out = 1 + pick(10);
      const auto a = sched_->add_request(id, m.tokens, sequence_options{.extra_key = m.extra, .priority = pick(3)});
      ASSERT_TRUE(a) << a.error().message();
      if (*a == admission::never) {
        ASSERT_EQ(kind, 0) << "a request that fits was rejected";
        m.f = fate::rejected;
      } else {
        ASSERT_NE(kind, 0) << "a request longer than the cache was queued";
        ++pending_;
        work_ += static_cast<std::int64_t>(m.tokens.size()) + m.max_out;
      }
      model_.emplace(id, std::move(m));
    }
  }

  void one_step(bool may_cancel) {
    scheduler<Cache>& s = *sched_;
    const step_output& out = s.schedule();
    step_began_ = false;
    check_schedule(out);
    if (::testing::Test::HasFatalFailure()) return;
    execute(out);
    if (::testing::Test::HasFatalFailure()) return;
    deliver(false);
    if (::testing::Test::HasFatalFailure()) return;
    if (pick(6) == 0) bad_reports();
    if (::testing::Test::HasFatalFailure()) return;
    // The step ran: sampled tokens for the sequences whose tokens are all computed.
    for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
      const scheduled_sequence& x = out.scheduled[i];
      if (!x.last_chunk) continue;
      request_model& m = model_.at(x.id);
      const bool done = m.generated + 1 >= m.max_out;
      const token_id t = generated_token(x.id, m.tokens.size());
      ASSERT_TRUE(s.complete_scheduled(i, t, done));
      step_began_ = true;  // the first token ends the step: the cache's next one begins
      ++m.generated;
      if (done) {
        end(m, fate::finished);
      } else {
        push_token(m, t);
      }
    }
    if (pick(4) == 0) refused_calls();
    if (::testing::Test::HasFatalFailure()) return;
    if (may_cancel) cancels();
    if (::testing::Test::HasFatalFailure()) return;
    check_step();
  }

  /// A few requests cancelled while they wait for their loads (their loads in flight keep their blocks until
  /// reported), and rarely wherever they are.
  void cancels() {
    scheduler<Cache>& s = *sched_;
    if (pick(12) == 0 && !s.loading().empty()) {
      const seq_id id = s.loading()[static_cast<std::size_t>(pick(static_cast<std::int32_t>(s.loading().size())))];
      const auto ls = cache_->load_state(id);
      ASSERT_TRUE(ls);
      // Its blocks (in every group) whose loads are still in flight: held by the transfers after the request is gone.
      std::vector<block_id> flying;
      for (std::int32_t t = 0; t < tables_; ++t)
        for (const block_id b : table(t, id))
          if (inflight_load_device(b)) flying.push_back(b);
      if (!flying.empty()) ++orphaned_loads_;
      ASSERT_TRUE(s.finish(id));
      ASSERT_FALSE(cache_->contains(id));
      ASSERT_EQ(s.state(id), request_state::unknown);
      for (const block_id b : flying) {
        ASSERT_GE(cache_->refcount(b), 1) << "device block " << b << " was released while its load is in flight";
        ASSERT_FALSE(cache_->is_free(b));
      }
      end(model_.at(id), fate::cancelled);
      ++cancelled_loading_;
    }
    if (pick(60) == 0) {
      std::vector<seq_id> ids(s.waiting().begin(), s.waiting().end());
      ids.insert(ids.end(), s.running().begin(), s.running().end());
      ids.insert(ids.end(), s.swapped().begin(), s.swapped().end());
      if (!ids.empty()) {
        const seq_id id = ids[static_cast<std::size_t>(pick(static_cast<std::int32_t>(ids.size())))];
        ASSERT_TRUE(s.finish(id));
        end(model_.at(id), fate::cancelled);
      }
    }
  }

  /// Right after schedule(): the queues agree with the cache; no request with loads pending is scheduled; the
  /// scheduled tokens are the appends and the slot mapping, on the block tables.
  void check_schedule(const step_output& out) {
    const Cache& cache = *cache_;
    const scheduler<Cache>& s = *sched_;
    ASSERT_TRUE(out.error.ok()) << out.error.message();
    ASSERT_EQ(out.plan, &cache.plan());
    for (const finished_request& f : out.finished) {
      ASSERT_NE(f.reason, finish_reason::cache_error);
      ASSERT_FALSE(cache.contains(f.id));
      request_model& m = model_.at(f.id);
      ASSERT_EQ(m.f, fate::pending);
      end(m, fate::finished_with_reason);
    }
    check_queues(true, true);
    if (::testing::Test::HasFatalFailure()) return;
    // max_num_seqs caps the running requests (no forks, no batch size tuning here), so the step's batch too. Counted
    // and reported once per configuration (run_case), so a violation does not hide the rest of the run.
    if (static_cast<std::int64_t>(s.running().size()) > cfg_.max_num_seqs ||
        static_cast<std::int64_t>(out.scheduled.size()) > cfg_.max_num_seqs) {
      if (over_max_seqs_++ == 0)
        first_over_max_seqs_ = describe() + ": " + std::to_string(s.running().size()) + " running, " +
                               std::to_string(out.scheduled.size()) + " scheduled, " +
                               std::to_string(s.loading().size()) + " loading";
    }

    const auto appends = cache.plan().appends();
    ASSERT_EQ(appends.size(), out.scheduled.size());
    // One slot mapping per table, table-major: table t's slots at [t x n, (t + 1) x n).
    const auto n = static_cast<std::size_t>(out.num_tokens());
    ASSERT_EQ(out.slot_mapping.size(), n * static_cast<std::size_t>(tables_));
    std::unordered_set<seq_id> scheduled;
    std::size_t slot = 0;
    std::int64_t budget = cfg_.max_num_batched_tokens;
    for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
      const scheduled_sequence& x = out.scheduled[i];
      ASSERT_TRUE(scheduled.insert(x.id).second);
      ASSERT_EQ(s.state(x.id), request_state::running) << "request " << x.id << " scheduled while not running";
      ASSERT_EQ(*cache.load_state(x.id), tier_load_state::none) << "request " << x.id << " scheduled before its loads";
      ASSERT_GE(x.num_tokens, 1);
      ASSERT_EQ(appends[i].seq, x.id);
      ASSERT_EQ(appends[i].first_pos, x.start);
      ASSERT_EQ(appends[i].count, x.num_tokens);
      ASSERT_EQ(x.start + x.num_tokens, s.num_computed_tokens(x.id));
      const request_model& m = model_.at(x.id);
      ASSERT_LE(static_cast<std::size_t>(x.start + x.num_tokens), m.tokens.size());
      ASSERT_EQ(x.last_chunk, static_cast<std::size_t>(x.start + x.num_tokens) == m.tokens.size());
      budget -= x.num_tokens;
      for (std::int64_t p = x.start; p < x.start + x.num_tokens; ++p, ++slot) {
        ASSERT_LT(slot, n);
        for (std::int32_t t = 0; t < tables_; ++t) {
          const block_id b = table(t, x.id)[static_cast<std::size_t>(p / block_size)];
          // A token computed in this step is read by the step's later tokens: never into the null block.
          ASSERT_GE(b, ccfg_.reserved_blocks) << "request " << x.id << "'s token " << p << " is computed into block "
                                              << b << " of table " << t << ": " << describe();
          ASSERT_EQ(out.slot_mapping[static_cast<std::size_t>(t) * n + slot],
                    std::int64_t{b} * block_size + p % block_size);
        }
      }
    }
    ASSERT_EQ(slot, n);
    ASSERT_GE(budget, 0) << "the token budget was exceeded";
  }

  /// The scheduler's queues against the cache. `fresh`: right after schedule(), which polled the loads, so a
  /// loading request is still loading; later in the step its loads may have come in, failed or timed out.
  /// `unexecuted`: the cache's current plan has not run yet (right after schedule(), or after the step's first
  /// sampled token began the next step, whose plan holds the write-through stores planned at its begin_step).
  void check_queues(bool fresh, bool unexecuted) {
    const Cache& cache = *cache_;
    const scheduler<Cache>& s = *sched_;
    std::unordered_set<seq_id> seen;
    std::int64_t tokens = 0;
    for (const seq_id id : s.running()) {
      ASSERT_TRUE(seen.insert(id).second) << "request " << id << " is listed twice";
      ASSERT_EQ(s.state(id), request_state::running);
      ASSERT_TRUE(cache.contains(id)) << "running request " << id << " is not in the cache";
      ASSERT_FALSE(cache.is_swapped(id));
      ASSERT_EQ(*cache.load_state(id), tier_load_state::none) << "running request " << id << " waits for loads";
      ASSERT_EQ(*cache.num_tokens(id), s.num_computed_tokens(id));
      tokens += *cache.num_tokens(id);
    }
    for (const seq_id id : s.swapped()) {
      ASSERT_TRUE(seen.insert(id).second) << "request " << id << " is listed twice";
      ASSERT_EQ(s.state(id), request_state::swapped);
      ASSERT_TRUE(cache.is_swapped(id));
      ASSERT_EQ(*cache.load_state(id), tier_load_state::none);
      ASSERT_EQ(*cache.num_tokens(id), s.num_computed_tokens(id));
      tokens += *cache.num_tokens(id);
    }
    for (const seq_id id : s.loading()) {
      ASSERT_TRUE(seen.insert(id).second) << "request " << id << " is listed twice";
      ASSERT_EQ(s.state(id), request_state::loading);
      ASSERT_TRUE(cache.contains(id)) << "loading request " << id << " is not in the cache";
      ASSERT_FALSE(cache.is_swapped(id));
      const auto ls = cache.load_state(id);
      ASSERT_TRUE(ls);
      if (fresh) {
        ASSERT_EQ(*ls, tier_load_state::loading)
            << "schedule() polled request " << id << " and kept it loading, but its loads are resolved";
      }
      ASSERT_EQ(*cache.num_tokens(id), s.num_computed_tokens(id));
      ASSERT_EQ(s.num_computed_tokens(id) % block_size, 0) << "a loading request's hit is whole blocks";
      ASSERT_LT(static_cast<std::size_t>(s.num_computed_tokens(id)), model_.at(id).tokens.size());
      tokens += *cache.num_tokens(id);
    }
    for (const seq_id id : s.waiting()) {
      ASSERT_TRUE(seen.insert(id).second) << "request " << id << " is listed twice";
      ASSERT_EQ(s.state(id), request_state::waiting);
      ASSERT_FALSE(cache.contains(id)) << "waiting request " << id << " holds a cache sequence";
      ASSERT_EQ(cache.load_state(id).code(), errc::unknown_sequence);
      ASSERT_EQ(s.num_computed_tokens(id), 0);
    }
    for (const seq_id id : seen) {
      const request_model& m = model_.at(id);
      ASSERT_EQ(m.f, fate::pending) << "request " << id << " ended but is still queued";
      const auto t = s.tokens(id);
      ASSERT_TRUE(std::equal(t.begin(), t.end(), m.tokens.begin(), m.tokens.end()))
          << "the scheduler's tokens of request " << id << " differ from the model's";
    }
    const scheduler_stats st = s.stats();
    ASSERT_EQ(st.running, static_cast<std::int32_t>(s.running().size()));
    ASSERT_EQ(st.swapped, static_cast<std::int32_t>(s.swapped().size()));
    ASSERT_EQ(st.waiting, static_cast<std::int32_t>(s.waiting().size()));
    ASSERT_EQ(st.loading, static_cast<std::int32_t>(s.loading().size()));
    const cache_stats cs = cache.stats();
    ASSERT_EQ(cs.sequences, static_cast<std::int32_t>(s.running().size() + s.swapped().size() + s.loading().size()));
    ASSERT_EQ(cs.tokens, tokens);
    ASSERT_EQ(cs.free + cs.used + cs.pending_free + cs.evictable, cs.total) << "pool accounting";
    // The transfers of a plan that has not run are not queued by the engine yet.
    std::int32_t planned = 0;
    if (unexecuted) {
      for (const block_swap& w : cache.plan().swap_outs()) planned += w.host >= nh_;
      for (const block_swap& w : cache.plan().swap_ins()) planned += w.host >= nh_;
    }
    ASSERT_EQ(cs.tier_in_flight, static_cast<std::int32_t>(inflight_.size()) + planned)
        << "the cache's transfers in flight are not the engine's undelivered ones: " << describe();
    const host_tier_stats ts = cache.tier().stats();
    ASSERT_EQ(ts.reading + ts.writing, cs.tier_in_flight);
    max_in_flight_ = std::max<std::int64_t>(max_in_flight_, cs.tier_in_flight);
    max_waiting_ = std::max<std::int64_t>(max_waiting_, st.waiting);
  }

  /// The engine's side of a step: swap-outs, swap-ins, copies, then the appended tokens' K/V, each in the memory
  /// plane of the group it names. Host tier transfers are queued (a write-back store reads its device block now).
  void execute(const step_output& out) {
    const step_plan& plan = cache_->plan();
    const auto tier_end = nh_ + case_.tier_blocks;
    // A swap or copy moves a real block of a group: never the null (reserved) device block, nor (with groups) the
    // swap pool's reserved host block 0.
    const auto check_swap = [&](const block_swap& w) {
      ASSERT_GE(w.host, grouped && nh_ > 0 ? 1 : 0);
      ASSERT_LT(w.host, tier_end);
      ASSERT_GE(w.device, ccfg_.reserved_blocks);
      ASSERT_LT(w.device, ccfg_.num_blocks);
      ASSERT_GE(w.group, 0);
      ASSERT_LT(w.group, tables_);
    };
    for (const block_swap& w : plan.swap_outs()) {
      check_swap(w);
      if (::testing::Test::HasFatalFailure()) return;
      ASSERT_FALSE(inflight_load_device(w.device)) << "a swap-out of device block " << w.device
                                                   << " whose load is in flight";
      if (w.host >= nh_) {  // a host tier store
        const auto h = static_cast<std::size_t>(w.host - nh_);
        ASSERT_FALSE(inflight_.count(w.host)) << "a store into host block " << w.host << " with a transfer in flight";
        host_valid_[h] = 2;  // being written
        if (case_.write == tier_write::back) copy_to_host(w);
        const bool stuck = pick(60) == 0;
        inflight_.emplace(w.host, transfer{tier_done{w, pick(100) >= 7}, false,
                                           step_ + (stuck ? case_.timeout + 2 + pick(6) : pick(max_delay_ + 1))});
      } else {
        copy_to_host(w);  // a preemption swap: in the step
        host_group_[static_cast<std::size_t>(w.host)] = w.group;
      }
    }
    std::unordered_set<block_id> loaded;
    for (const block_swap& w : plan.swap_ins()) {
      check_swap(w);
      if (::testing::Test::HasFatalFailure()) return;
      ASSERT_TRUE(loaded.insert(w.device).second) << "device block " << w.device << " swapped in twice";
      ASSERT_FALSE(inflight_load_device(w.device)) << "a swap-in into device block " << w.device
                                                   << " whose load is in flight";
      if (w.host >= nh_) {  // a host tier load
        const auto h = static_cast<std::size_t>(w.host - nh_);
        ASSERT_FALSE(inflight_.count(w.host)) << "a load of host block " << w.host << " with a transfer in flight";
        ASSERT_EQ(host_valid_[h], 1) << "a load of host block " << w.host << " whose last store was not reported ok";
        ASSERT_EQ(host_group_[static_cast<std::size_t>(w.host)], w.group)
            << "a load into group " << w.group << " of host block " << w.host << ", stored from another group";
        const bool stuck = pick(25) == 0;
        inflight_.emplace(w.host, transfer{tier_done{w, pick(100) >= 7}, true,
                                           step_ + (stuck ? case_.timeout + 2 + pick(4) : pick(max_delay_ + 1))});
      } else {
        ASSERT_EQ(host_group_[static_cast<std::size_t>(w.host)], w.group)
            << "a swap-in into group " << w.group << " of host block " << w.host << ", swapped out from another group";
        copy_from_host(w);
      }
    }
    std::unordered_set<block_id> dsts;
    for (const block_copy& c : plan.copies()) {
      ASSERT_TRUE(dsts.insert(c.dst).second);
      ASSERT_GE(std::min(c.src, c.dst), ccfg_.reserved_blocks) << "a copy of the null block";
      ASSERT_TRUE(c.group >= 0 && c.group < tables_);
      ASSERT_FALSE(inflight_load_device(c.src) || inflight_load_device(c.dst)) << "a copy of a block being loaded";
    }
    for (const block_copy& c : plan.copies()) {
      auto& plane = mem_[static_cast<std::size_t>(c.group)];
      std::copy_n(plane.begin() + std::int64_t{c.src} * block_size, block_size,
                  plane.begin() + std::int64_t{c.dst} * block_size);
    }
    // Table t's slots are at [t x n, (t + 1) x n) of the slot mapping (check_schedule checked them against the
    // tables): its group's K/V of each token.
    const auto n = static_cast<std::size_t>(out.num_tokens());
    for (std::int32_t t = 0; t < tables_; ++t) {
      std::size_t i = static_cast<std::size_t>(t) * n;
      for (const scheduled_sequence& x : out.scheduled) {
        const request_model& m = model_.at(x.id);
        for (std::int32_t p = x.start; p < x.start + x.num_tokens; ++p, ++i) {
          const std::int64_t slot = out.slot_mapping[i];
          ASSERT_GE(slot, std::int64_t{ccfg_.reserved_blocks} * block_size);
          ASSERT_FALSE(inflight_load_device(static_cast<block_id>(slot / block_size)))
              << "a write into device block " << slot / block_size << " whose load is in flight";
          mem_[static_cast<std::size_t>(t)][static_cast<std::size_t>(slot)] =
              gv(m.values[static_cast<std::size_t>(p)], t);
        }
      }
    }
    max_in_flight_ = std::max<std::int64_t>(max_in_flight_, static_cast<std::int64_t>(inflight_.size()));
  }

  bool inflight_load_device(block_id b) const {
    for (const auto& [h, t] : inflight_)
      if (t.load && t.done.swap.device == b) return true;
    return false;
  }

  /// Block w.device's bytes to host block w.host and back, in the plane of group w.group.
  void copy_to_host(const block_swap& w) {
    const auto g = static_cast<std::size_t>(w.group);
    std::copy_n(mem_[g].begin() + std::int64_t{w.device} * block_size, block_size,
                host_mem_[g].begin() + std::int64_t{w.host} * block_size);
  }
  void copy_from_host(const block_swap& w) {
    const auto g = static_cast<std::size_t>(w.group);
    std::copy_n(host_mem_[g].begin() + std::int64_t{w.host} * block_size, block_size,
                mem_[g].begin() + std::int64_t{w.device} * block_size);
  }
  void fill_garbage(std::vector<std::uint64_t>& m, block_id b) {
    for (std::int32_t k = 0; k < block_size; ++k) m[static_cast<std::size_t>(b * block_size + k)] = garbage();
  }

  /// Reports the transfers that are due (all of them with `all`), in random order and random batches; each
  /// transfer's bytes move (or garbage lands) just before it is reported.
  void deliver(bool all) {
    std::vector<transfer> due;
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      if (all || it->second.due <= step_) {
        due.push_back(it->second);
        it = inflight_.erase(it);
      } else {
        ++it;
      }
    }
    std::shuffle(due.begin(), due.end(), rng_);
    for (std::size_t at = 0; at < due.size();) {
      const std::size_t n = std::min<std::size_t>(due.size() - at, 1 + static_cast<std::size_t>(pick(4)));
      std::vector<tier_done> batch;
      for (std::size_t k = at; k < at + n; ++k) {
        const transfer& t = due[k];
        const block_swap& w = t.done.swap;
        const auto h = static_cast<std::size_t>(w.host - nh_);
        const auto g = static_cast<std::size_t>(w.group);
        if (t.load) {
          if (t.done.ok) {
            copy_from_host(w);
          } else {
            fill_garbage(mem_[g], w.device);
          }
        } else {
          if (!t.done.ok) {
            fill_garbage(host_mem_[g], w.host);
          } else if (case_.write == tier_write::through) {
            copy_to_host(w);  // the source block is pinned until now
          }
          host_valid_[h] = t.done.ok ? 1 : 0;
          host_group_[static_cast<std::size_t>(w.host)] = t.done.ok ? w.group : -1;
        }
        batch.push_back(t.done);
      }
      const status st = cache_->complete_tier_transfers(batch);
      ASSERT_TRUE(st) << st.message() << " (" << describe() << ")";
      at += n;
    }
  }

  /// Bad reports: each errc::invalid_argument, nothing changed.
  void bad_reports() {
    Cache& cache = *cache_;
    const cache_stats cs = cache.stats();
    const host_tier_stats ts = cache.tier().stats();
    const auto expect_refused = [&](std::vector<tier_done> batch, const char* what) {
      const status st = cache.complete_tier_transfers(batch);
      ASSERT_EQ(st.code(), errc::invalid_argument) << what << ": " << st.message();
      ASSERT_EQ(cache.stats(), cs) << what << " changed the cache";
      ASSERT_EQ(cache.tier().stats(), ts) << what << " changed the tier";
      ++bad_calls_;
    };
    // A tier host block with no transfer in flight.
    for (int tries = 0; tries < 4; ++tries) {
      const block_id h = nh_ + pick(case_.tier_blocks);
      if (inflight_.count(h)) continue;
      expect_refused({tier_done{block_swap{1 + pick(ccfg_.num_blocks - 1), h}, pick(2) == 0}}, "no such transfer");
      break;
    }
    if (::testing::Test::HasFatalFailure()) return;
    if (nh_ > 0) expect_refused({tier_done{block_swap{1, pick(nh_)}, true}}, "a swap pool block");
    expect_refused({tier_done{block_swap{1, nh_ + case_.tier_blocks + pick(3)}, true}}, "past the tier");
    expect_refused({tier_done{block_swap{1, -1 - pick(3)}, true}}, "a negative host block");
    if (::testing::Test::HasFatalFailure() || inflight_.empty()) return;
    auto it = inflight_.begin();
    std::advance(it, pick(static_cast<std::int32_t>(inflight_.size())));
    const tier_done t = it->second.done;
    expect_refused({t, t}, "the same transfer twice");
    expect_refused({t, tier_done{t.swap, !t.ok}}, "the same transfer twice, ok and failed");
    if (::testing::Test::HasFatalFailure()) return;
    for (int tries = 0; tries < 4; ++tries) {  // a transfer in flight, then one that is not
      const block_id h = nh_ + pick(case_.tier_blocks);
      if (inflight_.count(h)) continue;
      expect_refused({t, tier_done{block_swap{t.swap.device, h}, true}}, "a good entry, then a bad one");
      break;
    }
    block_id wrong = t.swap.device;
    while (wrong == t.swap.device) wrong = pick(ccfg_.num_blocks);
    expect_refused({tier_done{block_swap{wrong, t.swap.host}, t.ok}},
                   it->second.load ? "a load with the wrong device block" : "a store with the wrong device block");
    // An empty report is fine and changes nothing.
    ASSERT_TRUE(cache.complete_tier_transfers({}));
    ASSERT_EQ(cache.stats(), cs);
  }

  /// Calls on a request waiting for its loads: the cache's are errc::pending_append, the scheduler's (a sampled
  /// token, a fork, computing its pending tokens) refused as for a request that does not run; nothing changed.
  void refused_calls() {
    Cache& cache = *cache_;
    scheduler<Cache>& s = *sched_;
    if (!s.loading().empty()) {
      const seq_id id = s.loading()[static_cast<std::size_t>(pick(static_cast<std::int32_t>(s.loading().size())))];
      const scheduler_stats st = s.stats();
      const cache_stats cs = cache.stats();
      const std::int32_t computed = s.num_computed_tokens(id);
      const std::size_t tokens = s.tokens(id).size();
      ASSERT_EQ(s.complete(id, 1).code(), errc::invalid_argument) << "a token for a request waiting for loads";
      ASSERT_EQ(s.fork(id, next_id_ + 1'000'000).code(), errc::unknown_sequence) << "a fork of a loading request";
      ASSERT_EQ(s.compute_pending(id).code(), errc::unknown_sequence) << "a loading request computed";
      ASSERT_EQ(s.state(id), request_state::loading);
      ASSERT_EQ(s.num_computed_tokens(id), computed);
      ASSERT_EQ(s.tokens(id).size(), tokens);
      ASSERT_EQ(s.stats().loading, st.loading);
      ASSERT_EQ(cache.stats(), cs);
      bad_calls_ += 3;
    }
    for (const seq_id id : s.loading()) {
      const auto ls = cache.load_state(id);
      ASSERT_TRUE(ls);
      if (*ls == tier_load_state::none) continue;  // all in: it runs from the next step
      const std::vector<seq_id> ids{id};
      const auto before = kvtest::take_snapshot(cache, ids);
      const host_tier_stats ts = cache.tier().stats();
      const auto unchanged = [&](errc code, const char* what, errc expected = errc::pending_append) {
        ASSERT_EQ(code, expected) << what << " of a sequence waiting for loads";
        ASSERT_TRUE(kvtest::take_snapshot(cache, ids) == before) << what << " changed the cache";
        ASSERT_EQ(cache.tier().stats(), ts) << what << " changed the tier";
        ++bad_calls_;
      };
      unchanged(cache.append_tokens(id, token_count{1}).code(), "append_tokens(n)");
      const std::vector<token_id> more{1, 2};
      unchanged(cache.append_tokens(id, more).code(), "append_tokens(tokens)");
      unchanged(cache.fork(id, next_id_ + 1'000'000, 0).code(), "fork");
      // (Without a swap pool swap_out is unsupported whatever the sequence.)
      unchanged(cache.swap_out(id).code(), "swap_out", nh_ > 0 ? errc::pending_append : errc::unsupported);
      unchanged(cache.preempt(id).code(), "preempt");
      return;
    }
  }

  /// After the step: the queues again, every running request's computed tokens read back through its block
  /// tables (and every swapped one's through its host tables) are the model's.
  void check_step() {
    check_queues(false, step_began_);
    if (::testing::Test::HasFatalFailure()) return;
    const scheduler<Cache>& s = *sched_;
    for (const seq_id id : s.running()) check_content(id, false);
    for (const seq_id id : s.swapped()) check_content(id, true);
  }

  /// Request `id`'s computed tokens read back through each of its tables (on the host when `swapped`), in that
  /// table's group's plane: the null block only before a window group's window.
  void check_content(seq_id id, bool swapped) {
    const request_model& m = model_.at(id);
    const auto n = static_cast<std::size_t>(sched_->num_computed_tokens(id));
    ASSERT_LE(n, m.values.size());
    const char* where = swapped ? " (swapped)" : "";
    for (std::int32_t t = 0; t < tables_; ++t) {
      const std::span<const block_id> tab = swapped ? host_table(t, id) : table(t, id);
      ASSERT_GE(tab.size() * block_size, n);
      const std::vector<std::uint64_t>& memory = (swapped ? host_mem_ : mem_)[static_cast<std::size_t>(t)];
      const std::int64_t first_read = skipped(t, static_cast<std::int64_t>(n));
      for (std::size_t p = 0; p < n; ++p) {
        const block_id b = tab[p / block_size];
        if (grouped && b == 0) {  // the null block (on the host, the swap pool's reserved block 0)
          if (static_cast<std::int64_t>(p) < first_read) continue;
          FAIL() << "request " << id << where << "'s table " << t << " holds the null block at position " << p
                 << " of " << n << ", which its next token reads: " << describe();
        }
        if (memory[static_cast<std::size_t>(b) * block_size + p % block_size] != gv(m.values[p], t))
          FAIL() << "request " << id << where << " read back a wrong token at position " << p << " of " << n
                 << " in table " << t << " (block " << b << "): " << describe();
      }
    }
  }

  tier_case case_;
  std::mt19937 rng_;
  cache_config ccfg_;
  scheduler_config cfg_;
  Cache* cache_ = nullptr;
  scheduler<Cache>* sched_ = nullptr;
  block_id nh_ = 0;
  std::int64_t step_ = 0;
  std::int64_t usable_tokens_ = 0;
  std::int64_t work_ = 0;
  seq_id next_id_ = 1;
  std::vector<std::vector<token_id>> families_;
  std::unordered_map<seq_id, request_model> model_;
  std::int64_t pending_ = 0;  ///< requests of model_ still pending
  std::int32_t tables_ = 1;  ///< block tables per sequence: the KV cache groups (1 without groups)
  /// The emulated device pool, per group's layers (plane): one value per slot.
  std::vector<std::vector<std::uint64_t>> mem_;
  /// The emulated host pool, per group's layers: swap pool, then the tier's blocks.
  std::vector<std::vector<std::uint64_t>> host_mem_;
  std::vector<std::uint8_t> host_valid_;  ///< per tier block: 0 garbage or never written, 1 stored ok, 2 writing
  /// Per host block (swap pool, then tier): the group whose layers its last swap-out or ok store wrote (-1: none).
  std::vector<std::int32_t> host_group_;
  std::map<block_id, transfer> inflight_;  ///< undelivered host tier transfers, by host block
  std::int32_t max_delay_ = 3;  ///< a transfer's usual delay: 0 to max_delay_ steps
  bool step_began_ = false;  ///< a sampled token of this step began the cache's next step (begin_step)
  std::int64_t cancelled_loading_ = 0, orphaned_loads_ = 0, bad_calls_ = 0, max_in_flight_ = 0, max_waiting_ = 0;
  std::int64_t over_max_seqs_ = 0;   ///< steps with more than max_num_seqs requests running or scheduled
  std::string first_over_max_seqs_;  ///< the first of them
};

/// `runs` runs of configuration `c` (each with its own seed), then what they reached.
template <class Cache>
void run_case(const char* name, const tier_case& c, int runs = runs_per_config) {
  totals t;
  for (int r = 0; r < runs && !::testing::Test::HasFailure(); ++r) {
    tier_case rc = c;
    rc.seed = c.seed + 7919U * static_cast<std::uint32_t>(r);
    tier_async_run<Cache>(rc, rc.seed).run(t);
  }
  std::printf("%s: %d runs, %lld requests, %lld steps (at most %.3f of the bound; drains of %lld steps at most, "
              "%lld waiting at most); %lld admissions waited for loads, "
              "%lld load failures; %lld blocks loaded, %lld stored, %lld failed loads, %lld failed stores, %lld "
              "timeouts, %lld host hit tokens, at most %lld in flight; %lld cancelled while loading (%lld with loads "
              "in flight); %lld swap-outs, %lld recomputes, %lld finished with a reason, %lld rejected; %lld bad "
              "calls refused\n",
              name, runs, static_cast<long long>(t.requests), static_cast<long long>(t.steps),
              t.bound_ratio, static_cast<long long>(t.max_drain), static_cast<long long>(t.max_waiting),
              static_cast<long long>(t.load_waits), static_cast<long long>(t.load_failures),
              static_cast<long long>(t.loaded), static_cast<long long>(t.stored),
              static_cast<long long>(t.failed_loads), static_cast<long long>(t.failed_stores),
              static_cast<long long>(t.timeouts), static_cast<long long>(t.host_hit_tokens),
              static_cast<long long>(t.max_in_flight), static_cast<long long>(t.cancelled_loading),
              static_cast<long long>(t.orphaned_loads), static_cast<long long>(t.preempted_swap),
              static_cast<long long>(t.preempted_recompute), static_cast<long long>(t.finished_with_reason),
              static_cast<long long>(t.rejected), static_cast<long long>(t.bad_calls));
  EXPECT_EQ(t.over_max_seqs, 0) << "steps with more than max_num_seqs requests running or scheduled; the first: "
                                 << t.first_over_max_seqs;
  if (::testing::Test::HasFailure()) return;
  // The workload reaches what it is meant to exercise.
  EXPECT_GT(t.load_waits, 0) << "no admission waited for loads";
  EXPECT_GT(t.load_failures, 0) << "no request's loads failed";
  EXPECT_GT(t.failed_loads, 0);
  EXPECT_GT(t.failed_stores, 0);
  EXPECT_GT(t.timeouts, 0) << "no load timed out";
  EXPECT_GT(t.host_hit_tokens, 0) << "the host tier served no hit";
  EXPECT_GT(t.cancelled_loading, 0);
  EXPECT_GT(t.orphaned_loads, 0) << "no request was cancelled with loads in flight";
  EXPECT_GT(t.rejected, 0);
  EXPECT_GT(t.bad_calls, 0);
  EXPECT_GT(t.preempted_swap, 0);
  EXPECT_GT(t.preempted_recompute, 0);
}

using lru_cache = tiered_cache_with<lru_tier, hybrid_swap>;
using arc_cache = tiered_cache_with<arc_tier, hybrid_swap>;
// KV cache groups: hybrid_kv_cache<any_group_kind, free_list_allocator, lru_eviction, prefix_caching, hybrid_swap, T>.
using lru_groups_cache = groups_tiered_cache_with<lru_tier, hybrid_swap>;
using arc_groups_cache = groups_tiered_cache_with<arc_tier, hybrid_swap>;

// The hybrid cache's runs: half as many per configuration (so that the file keeps to its time), over a pool about
// twice as large (a prompt takes its blocks in both groups; the window's are given back as it moves on) and a tier
// and swap pool that hold both groups' blocks.
constexpr int hybrid_runs = runs_per_config / 2;

}  // namespace

TEST(TierAsyncLiveness, LruWriteThroughInclusive) {
  run_case<lru_cache>("lru write-through inclusive",
                      {.device_blocks = 32, .tier_blocks = 32, .swap_blocks = 12, .write = tier_write::through,
                       .inclusive = true, .timeout = 6, .seed = 101});
}

TEST(TierAsyncLiveness, ArcWriteBackInclusive) {
  run_case<arc_cache>("arc write-back inclusive",
                      {.device_blocks = 32, .tier_blocks = 24, .swap_blocks = 8, .write = tier_write::back,
                       .inclusive = true, .timeout = 5, .seed = 202});
}

TEST(TierAsyncLiveness, LruWriteBackExclusive) {
  run_case<lru_cache>("lru write-back exclusive",
                      {.device_blocks = 28, .tier_blocks = 48, .swap_blocks = 16, .write = tier_write::back,
                       .inclusive = false, .timeout = 8, .seed = 303});
}

TEST(TierAsyncLiveness, GroupsLruWriteThroughInclusiveNative) {
  run_case<lru_groups_cache>("groups lru write-through inclusive native",
                             {.device_blocks = 56, .tier_blocks = 56, .swap_blocks = 24, .write = tier_write::through,
                              .inclusive = true, .timeout = 6, .seed = 404, .conv = hybrid_conventions::native},
                             hybrid_runs);
}

TEST(TierAsyncLiveness, GroupsArcWriteBackInclusiveVllm) {
  run_case<arc_groups_cache>("groups arc write-back inclusive vllm",
                             {.device_blocks = 56, .tier_blocks = 48, .swap_blocks = 20, .write = tier_write::back,
                              .inclusive = true, .timeout = 5, .seed = 505, .conv = hybrid_conventions::vllm},
                             hybrid_runs);
}

TEST(TierAsyncLiveness, GroupsLruWriteBackExclusiveNative) {
  run_case<lru_groups_cache>("groups lru write-back exclusive native",
                             {.device_blocks = 52, .tier_blocks = 64, .swap_blocks = 28, .write = tier_write::back,
                              .inclusive = false, .timeout = 8, .seed = 606, .conv = hybrid_conventions::native},
                             hybrid_runs);
}

// Without async transfers there is nothing to report: complete_tier_transfers is errc::unsupported (and changes
// nothing), as it is for a cache without a host tier; async without a load timeout is refused at create.
TEST(TierAsyncLiveness, ReportsNeedAsyncTransfers) {
  cache_config cfg{4, 16, 1, 0, 4};
  cfg.host_tier = {.num_blocks = 8, .write = tier_write::through};
  auto sync = lru_cache::create(cfg);
  ASSERT_TRUE(sync) << sync.error().message();
  ASSERT_TRUE(sync->add_sequence(1, std::vector<token_id>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  sync->begin_step();  // the write-through stores of sequence 1's two full blocks are planned (complete at the next)
  ASSERT_EQ(sync->plan().swap_outs().size(), 2U);
  const cache_stats before = sync->stats();
  const host_tier_stats tier_before = sync->tier().stats();
  const std::vector<tier_done> none;
  EXPECT_EQ(sync->complete_tier_transfers(none).code(), errc::unsupported);
  for (const block_swap& w : sync->plan().swap_outs()) {
    const std::vector<tier_done> one{tier_done{w, true}};
    EXPECT_EQ(sync->complete_tier_transfers(one).code(), errc::unsupported);
  }
  const std::vector<tier_done> bogus{tier_done{block_swap{1, 4}, true}};
  EXPECT_EQ(sync->complete_tier_transfers(bogus).code(), errc::unsupported);
  EXPECT_EQ(sync->stats(), before);
  EXPECT_EQ(sync->tier().stats(), tier_before);
  EXPECT_EQ(*sync->load_state(1), tier_load_state::none);

  auto plain = hybrid_swap_cache::create(cache_config{4, 16, 1, 0, 4});
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->complete_tier_transfers(bogus).code(), errc::unsupported);

  cache_config bad = cfg;
  bad.host_tier.async = true;
  bad.host_tier.load_timeout_steps = 0;
  EXPECT_EQ(lru_cache::create(bad).code(), errc::invalid_argument);
}
