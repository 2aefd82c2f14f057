// SPDX-License-Identifier: Apache-2.0
// Liveness of the scheduler: randomized serving runs over the shipped cache compositions (every allocator,
// eviction, sharing and swap policy, in pairs), each preemption mode and victim order, watermarks from 0 to 10%,
// small and large token budgets, chunked prefill on and off, max_blocks_per_seq on and off, priorities with and
// without aging (INT32_MAX and INT32_MIN among them), forks, cancels of waiting, running, swapped and pending
// requests, sampled tokens given late (idle running requests), requests that grow until the cache cannot hold them,
// and empty or oversized prompts. Forks and cancels stop when arrivals do: the rest must drain by itself.
//
// After every step: no request is in two queues; the queues agree with the cache (running sequences are in the
// cache and not swapped, swapped ones are swapped, waiting ones are not in it) and the cache holds the tokens the
// scheduler counts as computed; each scheduled sequence's tokens are its slot-mapping entries, in order, on its
// block table. At the end every submitted request was finished (by the engine or by the scheduler with a reason),
// rejected with a reason, or reported as a dropped fork, within a bound computed from the workload.
#include <kvpager/kvpager.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <vector>

using namespace kvpager;

namespace {

#if defined(KVPAGER_TEST_REDUCED)
constexpr int runs_per_composition = 80;  // sanitizer and no-exception presets: smaller, same shapes
#else
constexpr int runs_per_composition = 500;
#endif

/// What became of a submitted request.
enum class fate { pending, finished, finished_with_reason, rejected, dropped_fork };

/// A cache with KV cache groups (hybrid_kv_cache).
template <class Cache>
concept grouped = requires(const Cache& c) { c.num_groups(); };

template <class Cache>
Cache make_cache(cache_config c, std::int32_t host_blocks, const std::vector<any_group_kind>& kinds,
                 const std::vector<std::int32_t>& units) {
  using W = typename Cache::swap_policy_type;
  if constexpr (grouped<Cache>) {
    // A host pool (host block 0 is reserved: at least 2 blocks), which preemption_mode::swap swaps to whatever the
    // swap policy, and cache_policy where the policy swaps.
    c.num_host_blocks = host_blocks >= 2 ? host_blocks : 0;
    // vLLM's conventions over vLLM's policies, native ones over the others (with groups of 1 to 3 units).
    const bool vllm = std::is_same_v<typename Cache::sharing_policy_type, prefix_caching>;
    if (vllm) return std::move(*Cache::create(c, kinds, {hybrid_conventions::vllm}));
    return std::move(*Cache::create(c, kinds, {hybrid_conventions::native, units}));
  } else {
    (void)kinds;
    (void)units;
    if constexpr (std::is_same_v<W, host_swap> || std::is_same_v<W, hybrid_swap>) c.num_host_blocks = host_blocks;
    return std::move(*Cache::create(c));
  }
}

template <class Cache>
class liveness_run {
 public:
  explicit liveness_run(std::uint32_t seed) : rng_(seed) {
    const std::int32_t block_sizes[] = {1, 2, 4, 8};
    ccfg_.block_size = block_sizes[pick(4)];
    ccfg_.num_blocks = 8 + pick(56);
    ccfg_.reserved_blocks = pick(2);
    ccfg_.max_blocks_per_seq = pick(2) == 0 ? 0 : 2 + pick(ccfg_.num_blocks);
    host_blocks_ = pick(2 * ccfg_.num_blocks);
    cfg_.max_num_seqs = 1 + pick(16);
    cfg_.max_num_batched_tokens = pick(2) == 0 ? 1 + pick(12) : 32 + pick(1024);
    cfg_.watermark_permille = pick(101);
    cfg_.victim = pick(2) == 0 ? preemption_order::newest_first : preemption_order::lowest_priority;
    cfg_.aging_steps = pick(2) == 0 ? 0 : 1 + pick(8);
    cfg_.chunked_prefill = pick(3) != 0;
    const preemption_mode modes[] = {preemption_mode::cache_policy, preemption_mode::recompute, preemption_mode::swap};
    cfg_.preemption = modes[pick(3)];
    num_requests_ = 10 + pick(40);
    arrival_steps_ = 1 + pick(60);
    // The admission rule and the tuning policies, drawn from a generator of their own (the draws above, and the
    // workload's, stay those of the runs without them).
    std::mt19937 tune(seed ^ 0x9e3779b9U);
    const auto draw = [&](std::uint32_t n) { return static_cast<std::int32_t>(tune() % n); };
    if (draw(3) == 0) {
      cfg_.admit_rule = admission_rule::request_headroom;
      cfg_.headroom_permille = draw(301);
    }
    if (draw(3) == 0) {
      cfg_.batch_tuning.enabled = true;
      cfg_.batch_tuning.max_seqs = 1 + draw(16);
      cfg_.batch_tuning.patience_steps = 1 + draw(3);
      cfg_.batch_tuning.cooldown_steps = draw(6);
    }
    if (draw(4) == 0) {
      cfg_.preemption = preemption_mode::adaptive;
      cfg_.swap_cost.block_bytes = std::int64_t{1} << 20;
      const double prefill[] = {1e-5, 1e-4, 1e-3};  // recompute cheaper, comparable, dearer than swapping
      cfg_.swap_cost.prefill_seconds_per_token = prefill[draw(3)];
      cfg_.swap_cost.link_bytes_per_second = 1.0e9 * ccfg_.block_size;
    }
    // Priority preemption (issue 21, point 10): a third of the runs, over priorities from INT32_MIN to INT32_MAX.
    if (draw(3) == 0) cfg_.priority_preemption = true;
    // A hybrid cache's groups: 1 to 3 of full, sliding-window and chunked-local kinds (sizes below and above the
    // block size), in a layout vLLM's grouping produces; the null block is reserved.
    if constexpr (grouped<Cache>) {
      std::mt19937 groups(seed ^ 0x85ebca6bU);
      const auto gdraw = [&](std::uint32_t n) { return static_cast<std::int32_t>(groups() % n); };
      ccfg_.reserved_blocks = 1;
      for (std::vector<vllm_kind> vk; vk.empty() || !check_vllm_layout(vk);) {
        kinds_.clear();
        vk.clear();
        for (std::int32_t g = 0, n = 1 + gdraw(3); g < n; ++g) {
          const std::int32_t k = gdraw(3);
          if (k == 0) kinds_.emplace_back(full_attention{});
          if (k == 1) kinds_.emplace_back(sliding_window{1 + gdraw(20)});
          if (k == 2) kinds_.emplace_back(chunked_local{1 + gdraw(20)});
          vk.push_back(vllm_kind_of(kinds_.back()));
        }
      }
      std::mt19937 units(seed ^ 0xc2b2ae35U);  // drawn apart: the runs without units keep their draws
      for (std::size_t g = 0; g < kinds_.size(); ++g) units_.push_back(1 + static_cast<std::int32_t>(units() % 3));
    }
  }

  void run() {
    Cache cache = make_cache<Cache>(ccfg_, host_blocks_, kinds_, units_);
    ASSERT_TRUE(cfg_.validate()) << describe();
    scheduler<Cache> s(cache, cfg_);
    const std::int64_t usable_tokens = std::int64_t{cache.stats().total} * ccfg_.block_size;
    std::int64_t step = 0;
    // The bound grows with the workload submitted: each token a request can compute (prompt and outputs), computed
    // up to 100 times over (recompute after preemption, budgets of one token a step), plus slack. A stuck request
    // never settles, so any finite bound catches it; runs stay far below this one (the test prints how far).
    std::int64_t bound = 0;
    for (;; ++step) {
      if (step < arrival_steps_) arrivals(s, usable_tokens);
      bound = arrival_steps_ + 1000 + 100 * work_;
      if (step >= arrival_steps_ && unsettled() == 0) break;
      ASSERT_LT(step, bound) << describe() << ": " << unsettled() << " requests still unsettled (waiting "
                             << s.stats().waiting << ", running " << s.stats().running << ", swapped "
                             << s.stats().swapped << ")";
      engine_calls(s, step < arrival_steps_);  // then no more forks or cancels: the rest drains by itself
      const step_output& out = s.schedule();
      check(cache, s, out);
      if (::testing::Test::HasFatalFailure()) return;
      settle(s, out);
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_EQ(s.stats().waiting + s.stats().running + s.stats().swapped, 0);
    cache.begin_step();
    EXPECT_EQ(cache.stats().used, 0) << describe();
    EXPECT_EQ(cache.stats().sequences, 0);
    EXPECT_EQ(cache.stats().host_free, cache.stats().host_total);
    if (std::getenv("KVPAGER_LIVENESS_VERBOSE") != nullptr)
      std::printf("%s: %d submitted, %lld work, %lld steps\n", describe().c_str(), submitted_,
                  static_cast<long long>(work_), static_cast<long long>(step));
    totals().steps += step;
    totals().bound_ratio = std::max(totals().bound_ratio, double(step) / double(bound));
    const scheduler_stats st = s.stats();
    totals().preempted_recompute += st.preempted_recompute;
    totals().preempted_swap += st.preempted_swap;
    totals().finished_with_reason += st.finished_with_reason;
    totals().dropped_forks += st.dropped_forks;
    totals().rejected += st.rejected;
    totals().preempted_for_priority += st.preempted_for_priority;
  }

  struct counts {
    std::int64_t steps = 0, preempted_recompute = 0, preempted_swap = 0, finished_with_reason = 0, dropped_forks = 0,
                 rejected = 0, preempted_for_priority = 0;
    double bound_ratio = 0;
  };
  static counts& totals() {
    static counts c;
    return c;
  }

 private:
  std::int32_t pick(std::int32_t n) { return static_cast<std::int32_t>(rng_() % static_cast<std::uint32_t>(n)); }

  std::string describe() const {
    char buf[384];
    std::snprintf(buf, sizeof buf,
                  "bs %d blocks %d reserved %d max_blocks_per_seq %d host %d | seqs %d budget %lld watermark %d "
                  "victim %d aging %d chunked %d mode %d rule %d headroom %d batch tuning %d priority preemption %d",
                  ccfg_.block_size, ccfg_.num_blocks, ccfg_.reserved_blocks, ccfg_.max_blocks_per_seq, host_blocks_,
                  cfg_.max_num_seqs, static_cast<long long>(cfg_.max_num_batched_tokens), cfg_.watermark_permille,
                  static_cast<int>(cfg_.victim), cfg_.aging_steps, cfg_.chunked_prefill ? 1 : 0,
                  static_cast<int>(cfg_.preemption), static_cast<int>(cfg_.admit_rule), cfg_.headroom_permille,
                  cfg_.batch_tuning.enabled ? cfg_.batch_tuning.max_seqs : 0, cfg_.priority_preemption ? 1 : 0);
    return buf;
  }

  std::int64_t unsettled() const {
    return std::count_if(fate_.begin(), fate_.end(), [](const auto& f) { return f.second == fate::pending; });
  }

  /// Arrivals: prompts sharing prefixes (prefix hits), a few empty or longer than the whole cache.
  void arrivals(scheduler<Cache>& s, std::int64_t usable_tokens) {
    const std::int32_t k = submitted_ < num_requests_ ? pick(3) : 0;
    for (std::int32_t i = 0; i < k; ++i, ++submitted_) {
      std::vector<token_id> p;
      const std::int32_t shape = pick(30);
      std::int64_t len = 1 + pick(3 * ccfg_.block_size + 4);
      if (shape == 0) len = 0;
      if (shape == 1) len = usable_tokens + 1 + pick(8);              // can never fit
      if (shape == 2) len = usable_tokens / 2 + pick(ccfg_.block_size);  // long: chunks, maybe over the caps
      const auto family = static_cast<token_id>(pick(3));
      for (std::int64_t t = 0; t < len; ++t)
        p.push_back(t < 2 * ccfg_.block_size ? 1000 * (family + 1) + static_cast<token_id>(t) : pick(4));
      const std::int32_t priorities[] = {0, 1, 5, -3, INT32_MAX, INT32_MIN, INT32_MAX - 1};
      const seq_id id = next_id_++;
      const auto a = s.add_request(id, p, priorities[pick(7)]);
      if (!a) {
        ASSERT_TRUE(p.empty()) << a.error().message();
        ASSERT_EQ(a.code(), errc::invalid_argument);
        fate_[id] = fate::rejected;
        continue;
      }
      if (*a == admission::never) {
        fate_[id] = fate::rejected;
        continue;
      }
      ASSERT_FALSE(p.empty());
      fate_[id] = fate::pending;
      // Some grow until the whole cache cannot hold them: through the last watermark's worth of blocks, where a
      // swapped or recomputed request can come back only when nothing else runs.
      max_out_[id] = pick(4) == 0 ? static_cast<std::int32_t>(usable_tokens) + 1 : 1 + pick(40);
      work_ += static_cast<std::int64_t>(p.size()) + max_out_[id];
    }
  }

  /// Between steps: forks of running requests and cancels wherever a request is (while requests arrive), and calls
  /// that must be refused.
  void engine_calls(scheduler<Cache>& s, bool may_cancel) {
    if (may_cancel && pick(6) == 0 && !s.running().empty()) {
      const seq_id parent = s.running()[static_cast<std::size_t>(pick(static_cast<std::int32_t>(s.running().size())))];
      const seq_id child = next_id_++;
      ASSERT_TRUE(s.fork(parent, child));
      fate_[child] = fate::pending;
      max_out_[child] = 1 + pick(20);
      work_ += static_cast<std::int64_t>(s.tokens(parent).size()) + max_out_[child];
      ASSERT_EQ(s.add_request(child, std::vector<token_id>{1}).code(), errc::duplicate_sequence);
    }
    if (may_cancel && pick(40) == 0) {
      std::vector<seq_id> ids(s.waiting().begin(), s.waiting().end());
      ids.insert(ids.end(), s.running().begin(), s.running().end());
      ids.insert(ids.end(), s.swapped().begin(), s.swapped().end());
      for (const auto& f : s.pending_forks()) ids.push_back(f.second);
      if (!ids.empty()) {
        const seq_id id = ids[static_cast<std::size_t>(pick(static_cast<std::int32_t>(ids.size())))];
        ASSERT_TRUE(s.finish(id));
        ASSERT_EQ(fate_[id], fate::pending);
        fate_[id] = fate::finished;
      }
    }
    if (pick(8) == 0 && !s.waiting().empty()) {  // a waiting request has no token to take
      const seq_id id = s.waiting().front();
      const auto before = s.tokens(id).size();
      ASSERT_EQ(s.complete(id, 3).code(), errc::invalid_argument);
      ASSERT_EQ(s.tokens(id).size(), before);
    }
  }

  void check(const Cache& cache, const scheduler<Cache>& s, const step_output& out) {
    ASSERT_TRUE(out.error.ok()) << out.error.message();
    ASSERT_EQ(out.plan, &cache.plan());
    std::unordered_set<seq_id> seen;
    std::int64_t tokens = 0;
    for (const seq_id id : s.running()) {
      ASSERT_TRUE(seen.insert(id).second) << "request " << id << " is listed twice";
      ASSERT_TRUE(cache.contains(id)) << "running request " << id << " is not in the cache";
      ASSERT_FALSE(cache.is_swapped(id));
      ASSERT_EQ(*cache.num_tokens(id), s.num_computed_tokens(id));
      ASSERT_GE(s.num_computed_tokens(id), 1);
      tokens += *cache.num_tokens(id);
    }
    for (const seq_id id : s.swapped()) {
      ASSERT_TRUE(seen.insert(id).second) << "request " << id << " is listed twice";
      ASSERT_TRUE(cache.is_swapped(id)) << "swapped request " << id << " is not swapped in the cache";
      ASSERT_EQ(*cache.num_tokens(id), s.num_computed_tokens(id));
      tokens += *cache.num_tokens(id);
    }
    for (const seq_id id : s.waiting()) {
      ASSERT_TRUE(seen.insert(id).second) << "request " << id << " is listed twice";
      ASSERT_FALSE(cache.contains(id)) << "waiting request " << id << " holds a cache sequence";
      ASSERT_EQ(s.num_computed_tokens(id), 0);
    }
    for (const auto& f : s.pending_forks()) ASSERT_FALSE(seen.count(f.second));
    ASSERT_EQ(cache.stats().sequences, static_cast<std::int32_t>(s.running().size() + s.swapped().size()));
    ASSERT_EQ(cache.stats().tokens, tokens);
    const scheduler_stats st = s.stats();
    ASSERT_EQ(st.running, static_cast<std::int32_t>(s.running().size()));
    ASSERT_EQ(st.swapped, static_cast<std::int32_t>(s.swapped().size()));
    ASSERT_EQ(st.waiting, static_cast<std::int32_t>(s.waiting().size()));

    // Scheduled sequences: distinct, running, their tokens the appends and slot-mapping entries in order.
    const auto appends = cache.plan().appends();
    ASSERT_EQ(appends.size(), out.scheduled.size());
    std::unordered_set<seq_id> scheduled;
    std::size_t slot = 0;
    std::int64_t budget = cfg_.max_num_batched_tokens;
    const std::int64_t bs = ccfg_.block_size;
    for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
      const scheduled_sequence& x = out.scheduled[i];
      ASSERT_TRUE(scheduled.insert(x.id).second);
      ASSERT_TRUE(std::find(s.running().begin(), s.running().end(), x.id) != s.running().end());
      ASSERT_GE(x.num_tokens, 1);
      ASSERT_EQ(appends[i].seq, x.id);
      ASSERT_EQ(appends[i].first_pos, x.start);
      ASSERT_EQ(appends[i].count, x.num_tokens);
      ASSERT_EQ(x.start + x.num_tokens, s.num_computed_tokens(x.id));
      ASSERT_EQ(x.last_chunk, static_cast<std::size_t>(x.start + x.num_tokens) == s.tokens(x.id).size());
      ASSERT_TRUE(cfg_.chunked_prefill || x.last_chunk) << "without chunked prefill a prompt is computed whole";
      budget -= x.num_tokens;
      if constexpr (grouped<Cache>) {  // table-major: table t's slots follow tables 0 .. t-1's
        const auto n = static_cast<std::size_t>(cache.plan().num_append_tokens());
        for (std::int32_t g = 0; g < cache.num_tables(); ++g) {
          const auto table = *cache.block_table(g, x.id);
          std::size_t at = slot + static_cast<std::size_t>(g) * n;
          for (std::int64_t p = x.start; p < x.start + x.num_tokens; ++p, ++at) {
            ASSERT_LT(at, out.slot_mapping.size());
            const block_id b = table[static_cast<std::size_t>(p / bs)];
            ASSERT_NE(b, Cache::null_block) << "a token's slot in a block its window released";
            ASSERT_EQ(out.slot_mapping[at], std::int64_t{b} * bs + p % bs);
          }
        }
        slot += static_cast<std::size_t>(x.num_tokens);
      } else {
        const auto table = *cache.block_table(x.id);
        for (std::int64_t p = x.start; p < x.start + x.num_tokens; ++p, ++slot) {
          ASSERT_LT(slot, out.slot_mapping.size());
          ASSERT_EQ(out.slot_mapping[slot], std::int64_t{table[static_cast<std::size_t>(p / bs)]} * bs + p % bs);
        }
      }
    }
    if constexpr (grouped<Cache>) {
      ASSERT_EQ(slot * static_cast<std::size_t>(cache.num_tables()), out.slot_mapping.size());
    } else {
      ASSERT_EQ(slot, out.slot_mapping.size());
    }
    ASSERT_GE(budget, 0) << "the token budget was exceeded";

    for (const finished_request& f : out.finished) {
      ASSERT_FALSE(seen.count(f.id));
      ASSERT_FALSE(scheduled.count(f.id));
      ASSERT_FALSE(cache.contains(f.id));
      ASSERT_NE(f.reason, finish_reason::cache_error);
      ASSERT_TRUE(f.reason != finish_reason::length_cap || ccfg_.max_blocks_per_seq > 0);
    }
    for (const seq_id id : out.dropped_forks) {
      ASSERT_FALSE(seen.count(id));
      ASSERT_FALSE(cache.contains(id));
    }
    for (const seq_id id : out.forked) {
      ASSERT_TRUE(std::find(s.running().begin(), s.running().end(), id) != s.running().end() ||
                  std::any_of(out.finished.begin(), out.finished.end(), [&](const auto& f) { return f.id == id; }) ||
                  std::find(s.waiting().begin(), s.waiting().end(), id) != s.waiting().end() ||
                  std::find(s.swapped().begin(), s.swapped().end(), id) != s.swapped().end());
    }
  }
  /// After the step ran: settle what the scheduler ended, then sample the sequences whose tokens are all computed.
  void settle(scheduler<Cache>& s, const step_output& out) {
    for (const finished_request& f : out.finished) {
      ASSERT_EQ(fate_[f.id], fate::pending);
      fate_[f.id] = fate::finished_with_reason;
    }
    for (const seq_id id : out.dropped_forks) {
      ASSERT_EQ(fate_[id], fate::pending);
      fate_[id] = fate::dropped_fork;
    }
    for (const seq_id id : out.forked) {  // a child of a parent still owed its token is owed one too
      if (fate_[id] != fate::pending) continue;  // created, then finished with a reason in the same step
      if (static_cast<std::size_t>(s.num_computed_tokens(id)) == s.tokens(id).size()) late_.emplace_back(id, 2);
    }
    for (const scheduled_sequence& x : out.scheduled) {
      if (!x.last_chunk) {
        ASSERT_EQ(s.complete(x.id, 1).code(), errc::invalid_argument) << "a partial prefill chunk takes no token";
        continue;
      }
      std::erase_if(late_, [&](const auto& l) { return l.first == x.id; });
      if (pick(6) == 0) {  // given late: within a few steps, or (1 in 4) after tens of steps
        late_.emplace_back(x.id, pick(4) == 0 ? 64 : 2);
        continue;
      }
      ASSERT_TRUE(sample(s, x.id));
      const bool done = fate_[x.id] == fate::finished;
      ASSERT_EQ(s.complete(x.id, 1).code(), done ? errc::unknown_sequence : errc::invalid_argument)
          << "one token per step";
    }
    // Tokens owed from earlier steps: a slow sampler gives them late, meanwhile the request idles, holding its
    // blocks. One preempted in between refuses the token: it is computed again and sampled then.
    for (std::size_t i = 0; i < late_.size();) {
      if (pick(late_[i].second) != 0) {
        ++i;
        continue;
      }
      const status st = sample(s, late_[i].first);
      if (st.code() == errc::invalid_argument) {
        ++i;
        continue;
      }
      ASSERT_TRUE(st.ok() || st.code() == errc::unknown_sequence) << st.message();
      late_.erase(late_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  /// The engine gives request `id` its sampled token; the last one it wants (or a random one) finishes it.
  status sample(scheduler<Cache>& s, seq_id id) {
    const bool done = generated_[id] + 1 >= max_out_[id] || (max_out_[id] <= 40 && pick(100) == 0);
    const status st = s.complete(id, static_cast<token_id>(pick(4)), done);
    if (st.ok()) {
      ++generated_[id];
      if (done) fate_[id] = fate::finished;
    }
    return st;
  }

  std::mt19937 rng_;
  cache_config ccfg_;
  std::vector<any_group_kind> kinds_;  ///< the groups of a hybrid cache (a layout vLLM's grouping can produce)
  std::vector<std::int32_t> units_;    ///< their units (native conventions only)
  scheduler_config cfg_;
  std::int32_t host_blocks_ = 0;
  std::int32_t num_requests_ = 0;
  std::int32_t arrival_steps_ = 0;
  std::int32_t submitted_ = 0;
  std::int64_t work_ = 0;  ///< tokens the submitted requests can compute at most (prompts plus outputs)
  seq_id next_id_ = 1;
  std::unordered_map<seq_id, fate> fate_;
  std::unordered_map<seq_id, std::int32_t> max_out_;
  std::unordered_map<seq_id, std::int32_t> generated_;
  /// Requests whose sampled token the engine gives late, each with 1 / (the chance it gives it in a step).
  std::vector<std::pair<seq_id, std::int32_t>> late_;
};

template <class Cache>
class Liveness : public ::testing::Test {};

// Every allocator, eviction, sharing and swap policy, crossed in pairs (lru_eviction needs free_list_allocator), and
// hybrid caches (KV cache groups) in both conventions, under every preemption mode (swapping every group's table).
// The sanitizer and no-exception presets (KVPAGER_TEST_REDUCED) compile four of them, which still cover every
// allocator, every swap policy and every sharing policy: each composition is a whole cache and scheduler to build.
#if defined(KVPAGER_TEST_REDUCED)
using compositions = ::testing::Types<
    vllm_v1_cache,                                                                    // free_list lru prefix no_swap
    paged_kv_cache<free_list_allocator, priority_lru, refcount_sharing, host_swap>,
    paged_kv_cache<lifo_allocator, lfu_eviction, no_sharing, recompute>,
    paged_kv_cache<lowest_id_allocator, priority_lru, prefix_caching, hybrid_swap>,
    hybrid_kv_cache<any_group_kind>>;  // KV cache groups, vLLM's conventions
#else
using compositions = ::testing::Types<
    vllm_v1_cache,                                                                    // free_list lru prefix no_swap
    paged_kv_cache<>,                                                                 // free_list none refcount no_swap
    paged_kv_cache<free_list_allocator, lru_eviction, prefix_caching, hybrid_swap>,
    paged_kv_cache<free_list_allocator, priority_lru, refcount_sharing, host_swap>,
    paged_kv_cache<free_list_allocator, fifo_eviction, no_sharing, recompute>,
    paged_kv_cache<lifo_allocator, lru_index_eviction, prefix_caching, host_swap>,
    paged_kv_cache<lifo_allocator, fifo_eviction, prefix_caching, no_swap>,
    paged_kv_cache<lifo_allocator, no_eviction, refcount_sharing, hybrid_swap>,
    paged_kv_cache<lifo_allocator, lfu_eviction, no_sharing, recompute>,
    paged_kv_cache<lowest_id_allocator, lfu_eviction, prefix_caching, recompute>,
    paged_kv_cache<lowest_id_allocator, priority_lru, prefix_caching, hybrid_swap>,
    paged_kv_cache<lowest_id_allocator, no_eviction, no_sharing, host_swap>,
    paged_kv_cache<lowest_id_allocator, lru_index_eviction, refcount_sharing, no_swap>,
    hybrid_kv_cache<any_group_kind>,                                                  // KV cache groups, vLLM's
    hybrid_kv_cache<any_group_kind, lifo_allocator, lru_index_eviction, refcount_sharing>,  // and native
    hybrid_kv_cache<any_group_kind, free_list_allocator, priority_lru, prefix_caching, hybrid_swap>>;
#endif

class composition_names {
 public:
  template <class T>
  static std::string GetName(int i) {
    return "composition" + std::to_string(i);
  }
};
TYPED_TEST_SUITE(Liveness, compositions, composition_names);

}  // namespace

TYPED_TEST(Liveness, EveryRequestIsFinishedOrRejectedWithAReason) {
  using counts = typename liveness_run<TypeParam>::counts;
  const auto seed = static_cast<std::uint32_t>(std::hash<std::string>{}(typeid(TypeParam).name()));
  for (int r = 0; r < runs_per_composition && !::testing::Test::HasFailure(); ++r) {
    liveness_run<TypeParam>(static_cast<std::uint32_t>(seed + 7919 * static_cast<std::uint32_t>(r))).run();
  }
  const counts& c = liveness_run<TypeParam>::totals();
  std::printf("liveness: %d runs, %lld steps (at most %.3f of the bound), %lld recompute, %lld swap-outs, %lld finished "
              "with a reason, %lld dropped forks, %lld rejected\n",
              runs_per_composition, static_cast<long long>(c.steps), c.bound_ratio,
              static_cast<long long>(c.preempted_recompute), static_cast<long long>(c.preempted_swap),
              static_cast<long long>(c.finished_with_reason), static_cast<long long>(c.dropped_forks),
              static_cast<long long>(c.rejected));
  if (runs_per_composition >= 20) {  // the workload reaches what it is meant to exercise
    EXPECT_GT(c.preempted_recompute, 0);
    EXPECT_GT(c.finished_with_reason, 0);
    EXPECT_GT(c.rejected, 0);
    EXPECT_GT(c.preempted_for_priority, 0) << "priority preemption never happened";
    if constexpr (grouped<TypeParam>) {
      EXPECT_GT(c.preempted_swap, 0) << "a hybrid cache never swapped";
    }
  }
}
