// SPDX-License-Identifier: Apache-2.0
#pragma once
// The engine loop: kvpager's scheduler over a shipped composition, one step at a time, written only against the
// public API (docs/generate.md):
//
//   const step_output& out = sched.schedule();        // the step: plan, slot mapping, page tables, tokens, positions
//   exec.run_plan(*out.plan);                          // swaps and copies (copy-on-write), every layer
//   model.forward(out.input_ids, out.positions, ...)   // K/V by kv_append, attention by kvpager's kernels
//   sched.complete_scheduled(i, token, finished);      // the sampled token of each entry whose prompt is done
//
// Parallel sampling (n > 1) forks: when a request's prompt is computed, its other samples are forked from it
// (scheduler::fork: they share its blocks by reference count; the first write into the shared partial block copies
// it, a copy the plan carries). Each sample draws its own first token from the prompt's logits, so the parent gives
// its token only once the children exist (the step after), and each child gives its own then. A fork the cache
// refuses falls back to a request of its own with the same prompt (a prefix hit). Every sample ends finished ("stop",
// "length") or with the reason it was refused.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <string>
#include <unordered_map>
#include <vector>

#include <kvpager/monitor/metrics.hpp>
#include <kvpager/sched/scheduler.hpp>

#include "model.hpp"
#include "paged_attention.hpp"
#include "results.hpp"
#if KVPAGER_GENERATE_HAS_UCX
#include "disagg.hpp"
#endif

namespace kvgen {

struct engine_options {
  std::int32_t max_model_len = 0;
  std::int32_t keep_top = 0;  ///< top logits kept per generated position (--logprobs / --top-logits / --reference)
  std::vector<std::int32_t> eos;
  std::int64_t bytes_per_block = 0;  ///< KV bytes of one block over all layers (the monitor's byte figures)
  /// Called after every step with its number and the snapshot (for --report and progress).
  std::function<void(std::int64_t, const kvpager::metrics_snapshot&, std::int64_t done, std::int64_t total)> on_step;
};

/// What the run measured.
struct engine_stats {
  std::int64_t steps = 0, prompt_tokens = 0, computed_tokens = 0, prefill_tokens = 0, decode_tokens = 0;
  std::int64_t generated = 0, forks = 0, fork_fallbacks = 0, block_copies = 0, swap_outs = 0, swap_ins = 0;
  double wall_s = 0, schedule_s = 0, plan_s = 0, forward_s = 0, sample_s = 0;
  /// Each step's time shared among its tokens (a prompt token and a decode token cost about the same GEMM work):
  /// the prefill and the decode share, for the tokens/s of each.
  double prefill_s = 0, decode_s = 0;
  double peak_kv_usage = 0;
  /// Largest (allocated slots - held tokens) / running sequences over the steps: at most one partly filled block.
  double max_slack_tokens_per_seq = 0;
  std::int64_t max_slack_tokens = 0, slack_sequences_at_max = 0;
};

template <class Cache>
class engine {
  /// The cache takes KV from outside (sequence_options::external_tokens): the disaggregated roles need it.
  static constexpr bool external_kv = requires(Cache& c, kvpager::seq_id id) { c.complete_external(id, true); };

  /// Sequence `id`'s block tables (one per KV cache group table; one for a paged_kv_cache), or false.
  bool tables_of(kvpager::seq_id id, std::vector<std::span<const kvpager::block_id>>& out) const {
    return cache_.block_tables(id, out).ok();
  }

 public:
  engine(transformer& m, Cache& cache, kvpager::step_executor& exec, paged_attention& attn,
         const kvpager::scheduler_config& cfg, engine_options o)
      : m_(m), cache_(cache), exec_(exec), attn_(attn), sched_(cache, cfg), o_(std::move(o)) {}

  [[nodiscard]] const kvpager::scheduler<Cache>& scheduler() const noexcept { return sched_; }
  [[nodiscard]] const engine_stats& stats() const noexcept { return st_; }
#if KVPAGER_GENERATE_HAS_UCX
  /// Runs as one instance of a disaggregated pair (disagg.hpp): a prefill instance holds and offers each request
  /// once its prompt is computed; a decode instance takes its requests from the offers it receives.
  void set_link(disagg_link* link) noexcept { link_ = link; }
#endif

  /// Runs every request to its end. Returns "" or the error that stopped the run (a kernel or executor error).
  std::string run(const std::vector<gen_request>& reqs, std::vector<request_result>& results) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto since = [&] { return std::chrono::duration<double>(clock::now() - start).count(); };
    results.assign(reqs.size(), {});
    for (std::size_t r = 0; r < reqs.size(); ++r) {
      results[r].samples.resize(static_cast<std::size_t>(reqs[r].n));
      st_.prompt_tokens += static_cast<std::int64_t>(reqs[r].prompt.size()) * reqs[r].n;
      if (reqs[r].max_tokens == 0) {
        for (sample_result& s : results[r].samples) s.finish_reason = "length";
        continue;
      }
#if KVPAGER_GENERATE_HAS_UCX
      if (link_ != nullptr && link_->options().role == kv_role::decode) {  // its KV comes from the prefill instance
        if (link_->ours(r)) remote_pending_.push_back(r);
        continue;
      }
#endif
      start_request(r, reqs, results);
    }
    last_link_event_ = clock::now();
    std::vector<std::int32_t> rows;
    std::vector<float> logits;
    std::int64_t idle = 0;
    while (live_ > 0 || link_waits()) {
      auto t = clock::now();
      const auto step_start = t;
      std::int64_t step_prefill = 0, step_decode = 0;
      if (std::string e = link_before_step(reqs, results); !e.empty()) return e;
      const kvpager::step_output& out = sched_.schedule();
      st_.schedule_s += std::chrono::duration<double>(clock::now() - t).count();
      if (std::string e = link_after_schedule(out); !e.empty()) return e;
      ++st_.steps;
      t = clock::now();
      if (const kvpager::status s = exec_.run_plan(*out.plan); !s) return std::string("step plan: ") + s.message();
      st_.block_copies += static_cast<std::int64_t>(out.plan->copies().size());
      st_.swap_outs += static_cast<std::int64_t>(out.plan->swap_outs().size());
      st_.swap_ins += static_cast<std::int64_t>(out.plan->swap_ins().size());
      st_.plan_s += std::chrono::duration<double>(clock::now() - t).count();
      // The forward pass over the step's tokens; logits for each entry whose last pending token is computed.
      rows.clear();
      for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
        const kvpager::scheduled_sequence& e = out.scheduled[i];
        (e.prefill ? step_prefill : step_decode) += e.num_tokens;
        if (e.last_chunk) rows.push_back(out.query_start_loc[i + 1] - 1);
      }
      st_.computed_tokens += out.num_tokens();
      st_.prefill_tokens += step_prefill;
      st_.decode_tokens += step_decode;
      t = clock::now();
      if (!out.scheduled.empty()) {
        attn_.begin(out);
        if (std::string e = m_.forward(out.input_ids, out.positions, attn_, rows, logits); !e.empty()) return e;
      }
      st_.forward_s += std::chrono::duration<double>(clock::now() - t).count();
      t = clock::now();
      std::int64_t given = 0;
      for (const kvpager::finished_request& f : out.finished)
        end(f.id, reqs, results, f.reason == kvpager::finish_reason::length_cap ? "length"
                                 : f.reason == kvpager::finish_reason::too_long
                                     ? "too_long: the sequence no longer fits the KV cache"
                                     : std::string("cache_error: ") + out.error.message());
      for (const kvpager::seq_id c : out.dropped_forks) {  // the parent stopped or the cache refused: run it alone
        ++st_.fork_fallbacks;
        --live_;  // counted when the fork was asked for; add() counts it again
        seqs_[c].await_own = false;
        seqs_[c].own_logits.clear();
        add(c, reqs, results);
      }
      for (const kvpager::seq_id c : out.forked) seqs_[c].await_own = true;
      std::size_t row = 0;
      for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
        const kvpager::scheduled_sequence& e = out.scheduled[i];
        if (!e.last_chunk) continue;
        const float* lg = logits.data() + row++ * static_cast<std::size_t>(m_.config().vocab_size);
        seq& s = seqs_.at(e.id);
        if (s.forks_pending) {  // n > 1: fork the other samples first; each then draws its own first token
          s.forks_pending = false;
          s.own_logits.assign(lg, lg + m_.config().vocab_size);
          s.await_own = true;
          s.await_step = st_.steps + 1;
          for (std::int32_t k = 1; k < reqs[static_cast<std::size_t>(s.req)].n; ++k) {
            const kvpager::seq_id c = new_seq(s.req, k);
            seq& child = seqs_.at(c);
            child.own_logits = seqs_.at(e.id).own_logits;
            ++live_;
            if (sched_.fork(e.id, c)) {
              ++st_.forks;
            } else {
              ++st_.fork_fallbacks;
              --live_;
              seqs_.at(c).own_logits.clear();
              add(c, reqs, results);
            }
          }
          continue;
        }
        s.await_own = false;
        if (std::string err = give(e.id, lg, reqs, results, since, i); !err.empty()) return err;
        ++given;
      }
      // Samples that draw from logits computed earlier: forked children, and parents once their children exist.
      awaiting_.clear();
      for (const auto& [id, s] : seqs_)
        if (s.await_own && s.await_step <= st_.steps && sched_.state(id) == kvpager::request_state::running &&
            sched_.num_computed_tokens(id) == static_cast<std::int32_t>(sched_.tokens(id).size()))
          awaiting_.push_back(id);
      std::sort(awaiting_.begin(), awaiting_.end());
      for (const kvpager::seq_id id : awaiting_) {
        seq& s = seqs_.at(id);
        s.await_own = false;
        std::vector<float> lg = std::move(s.own_logits);
        s.own_logits.clear();
        if (std::string err = give(id, lg.data(), reqs, results, since, SIZE_MAX); !err.empty()) return err;
        ++given;
      }
      st_.sample_s += std::chrono::duration<double>(clock::now() - t).count();
      if (step_prefill + step_decode > 0) {
        const double step_s = std::chrono::duration<double>(clock::now() - step_start).count();
        const auto total = static_cast<double>(step_prefill + step_decode);
        st_.prefill_s += step_s * static_cast<double>(step_prefill) / total;
        st_.decode_s += step_s * static_cast<double>(step_decode) / total;
      }
      const kvpager::metrics_snapshot snap = kvpager::take_snapshot(cache_, sched_, o_.bytes_per_block);
      st_.peak_kv_usage = std::max(st_.peak_kv_usage, snap.kv_cache_usage);
      const auto cs = cache_.stats();
      const std::int64_t slack = std::int64_t{cs.logical} * cs.block_size - cs.tokens;
      const std::int64_t running = sched_.stats().running;
      if (running > 0 && static_cast<double>(slack) / static_cast<double>(running) > st_.max_slack_tokens_per_seq) {
        st_.max_slack_tokens_per_seq = static_cast<double>(slack) / static_cast<double>(running);
        st_.max_slack_tokens = slack;
        st_.slack_sequences_at_max = running;
      }
      if (o_.on_step) o_.on_step(st_.steps, snap, done_, total_);
      idle = out.num_tokens() == 0 && given == 0 && out.forked.empty() ? idle + 1 : 0;
      if (idle > 0 && link_waits()) {  // waiting for the other instance, not stuck: bounded by its timeouts
        idle = 0;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (idle > 1000) return "no progress in 1000 steps (" + std::to_string(live_) + " samples left)";
    }
    st_.wall_s = since();
    return "";
  }

 private:
  struct seq {
    std::int32_t req = 0, sample = 0;
    bool forks_pending = false;  ///< n > 1 and its prompt not computed yet: fork the others when it is
    bool await_own = false;      ///< draws its next token from own_logits once it is running with nothing pending
    std::int64_t await_step = 0;
    std::vector<float> own_logits;
  };

  kvpager::seq_id new_seq(std::int32_t req, std::int32_t sample) {
    const kvpager::seq_id id = next_id_++;
    seqs_[id] = seq{req, sample, false, false, 0, {}};
    ++total_;
    return id;
  }

  /// Request `r`'s first sample (the others fork from it once its prompt is computed), added to the scheduler
  /// with `external_tokens`. Its sequence id (no longer in seqs_ when the scheduler refused it).
  kvpager::seq_id start_request(std::size_t r, const std::vector<gen_request>& reqs, std::vector<request_result>& results,
                                std::int32_t external_tokens = 0) {
    const kvpager::seq_id id = new_seq(static_cast<std::int32_t>(r), 0);
    seqs_[id].forks_pending = reqs[r].n > 1;
    add(id, reqs, results, external_tokens);
    return id;
  }

  void add(kvpager::seq_id id, const std::vector<gen_request>& reqs, std::vector<request_result>& results,
           std::int32_t external_tokens = 0) {
    const seq& s = seqs_.at(id);
    const gen_request& r = reqs[static_cast<std::size_t>(s.req)];
    const auto a = sched_.add_request(id, r.prompt, kvpager::sequence_options{.external_tokens = external_tokens});
    if (!a || *a == kvpager::admission::never) {
      // Refused whole: its prompt cannot fit even an empty cache (or the cache's table limit).
      std::string why = !a ? std::string("rejected: ") + a.error().message()
                           : "rejected: the prompt does not fit the KV cache (" + std::to_string(r.prompt.size()) +
                                 " tokens)";
      const std::int32_t first = s.forks_pending ? 0 : s.sample, last = s.forks_pending ? r.n : s.sample + 1;
      for (std::int32_t k = first; k < last; ++k)
        results[static_cast<std::size_t>(s.req)].samples[static_cast<std::size_t>(k)].finish_reason = why;
      seqs_.erase(id);
      ++done_;
      return;
    }
    ++live_;
#if KVPAGER_GENERATE_HAS_UCX
    if (link_ != nullptr && link_->options().role == kv_role::prefill) (void)sched_.hold(id);
#endif
  }

  void end(kvpager::seq_id id, const std::vector<gen_request>& reqs, std::vector<request_result>& results,
           const std::string& why) {
    const auto it = seqs_.find(id);
    if (it == seqs_.end()) return;
    const seq& s = it->second;
    const std::int32_t first = s.forks_pending ? 0 : s.sample,
                       last = s.forks_pending ? reqs[static_cast<std::size_t>(s.req)].n : s.sample + 1;
    for (std::int32_t k = first; k < last; ++k)
      results[static_cast<std::size_t>(s.req)].samples[static_cast<std::size_t>(k)].finish_reason = why;
    seqs_.erase(it);
    --live_;
    ++done_;
  }

  template <class Since>
  std::string give(kvpager::seq_id id, const float* lg, const std::vector<gen_request>& reqs,
                   std::vector<request_result>& results, Since&& since, std::size_t entry) {
    seq& s = seqs_.at(id);
    const gen_request& r = reqs[static_cast<std::size_t>(s.req)];
    sample_result& out = results[static_cast<std::size_t>(s.req)].samples[static_cast<std::size_t>(s.sample)];
    position_record rec;
    const std::int32_t tok =
        sample_token(lg, m_.config().vocab_size, r.sampling, static_cast<std::uint32_t>(s.sample),
                     static_cast<std::int32_t>(out.tokens.size()), o_.keep_top, rec, scratch_);
    out.tokens.push_back(tok);
    out.positions.push_back(std::move(rec));
    if (out.first_token_s < 0) out.first_token_s = since();
    ++st_.generated;
    const char* why = stop_reason(r, o_.eos, tok, out.tokens.size(), o_.max_model_len);
    const bool fin = *why != 0;
    const kvpager::status st = entry != SIZE_MAX ? sched_.complete_scheduled(entry, tok, fin) : sched_.complete(id, tok, fin);
    if (!st) return "complete(" + std::to_string(id) + "): " + st.message();
    if (fin) {
      out.finish_reason = why;
#if KVPAGER_GENERATE_HAS_UCX
      if constexpr (external_kv) {
        if (link_ != nullptr && link_->options().role == kv_role::prefill) {  // held: offer its KV
          if (!tables_of(id, tables_)) return "block_table(" + std::to_string(id) + "): the cache lost it";
          bool sent = false;
          if (std::string e = link_->offer(static_cast<std::size_t>(s.req), r.prompt, tables_, sent); !e.empty())
            return e;
          if (sent) {
            held_[static_cast<std::size_t>(s.req)] = id;
          } else {  // its decode instance is gone: nothing to hold the blocks for
            (void)sched_.release(id);
          }
          last_link_event_ = std::chrono::steady_clock::now();
        }
      }
#endif
      seqs_.erase(id);
      --live_;
      ++done_;
    }
    return "";
  }

  /// Whether the loop must go on for the other instance: a prefill instance until every held request is released
  /// (or its decode instance is gone, or silent past the timeout); a decode instance until every request of its
  /// share has arrived (or been given up on) and no read is in flight.
  [[nodiscard]] bool link_waits() const {
#if KVPAGER_GENERATE_HAS_UCX
    if (link_ == nullptr) return false;
    if (link_->options().role == kv_role::prefill) return !held_.empty();
    return !remote_pending_.empty() || link_->reads_in_flight() > 0;
#else
    return false;
#endif
  }

  std::string link_before_step(const std::vector<gen_request>& reqs, std::vector<request_result>& results) {
#if KVPAGER_GENERATE_HAS_UCX
    if constexpr (external_kv) return link_before_step_external(reqs, results);
#endif
    (void)reqs, (void)results;
    return "";
  }

#if KVPAGER_GENERATE_HAS_UCX
  std::string link_before_step_external(const std::vector<gen_request>& reqs, std::vector<request_result>& results) {
    if (link_ == nullptr) return "";
    const auto now = std::chrono::steady_clock::now();
    const bool silent = now - last_link_event_ > link_->options().timeout;
    if (link_->options().role == kv_role::prefill) {
      std::vector<kvpager::seq_id> done;
      std::vector<std::size_t> gone;
      link_->poll_done(done, gone);
      if (!done.empty()) last_link_event_ = now;
      for (const kvpager::seq_id r : done) release_held(static_cast<std::size_t>(r));
      for (const std::size_t k : gone)  // a decode instance that is gone reads nothing more
        for (std::size_t r = 0; r < reqs.size(); ++r)
          if (link_->peer_of(r) == k) release_held(r);
      if (silent && live_ == 0)  // every request offered, nothing heard for the timeout: stop holding them
        while (!held_.empty()) release_held(held_.begin()->first);
      return "";
    }
    std::vector<kvpager::kv_received> ended;
    link_->progress(ended);
    for (const kvpager::kv_received& r : ended) {
      last_link_event_ = now;
      const auto it = external_.find(static_cast<std::size_t>(r.id));
      if (it == external_.end()) continue;
      if (const kvpager::status st = cache_.complete_external(it->second, r.ok); !st)
        return "complete_external: " + std::string(st.message());
      external_.erase(it);
      started_.erase(static_cast<std::size_t>(r.id));
    }
    std::vector<kvpager::kv_offer> offers;
    std::vector<kvpager::seq_id> refused;
    bool gone = false;
    if (std::string e = link_->poll_offers(offers, refused, gone); !e.empty()) return e;
    for (const kvpager::seq_id id : refused) {  // offered, and declined by the receiver itself: computed here
      const auto at = std::find(remote_pending_.begin(), remote_pending_.end(), static_cast<std::size_t>(id));
      if (at == remote_pending_.end()) continue;
      last_link_event_ = now;
      remote_pending_.erase(at);
      ++link_->stats().recomputed_locally;
      start_request(static_cast<std::size_t>(id), reqs, results);
    }
    for (const kvpager::kv_offer& o : offers) {
      last_link_event_ = now;
      const auto at = std::find(remote_pending_.begin(), remote_pending_.end(), static_cast<std::size_t>(o.id));
      const std::size_t r = static_cast<std::size_t>(o.id);
      if (at == remote_pending_.end() || o.tokens != reqs[r].prompt) {  // not ours, twice, or another prompt
        link_->decline(o.id);
        continue;
      }
      remote_pending_.erase(at);
      const kvpager::seq_id id = start_request(r, reqs, results, static_cast<std::int32_t>(o.computed));
      if (seqs_.count(id) != 0) {
        external_[r] = id;
      } else {
        link_->decline(o.id);  // refused here (it can never fit): the sender need not hold it
      }
    }
    if (gone || silent) {  // no more offers will come: compute the rest here
      for (const std::size_t r : remote_pending_) {
        ++link_->stats().recomputed_locally;
        start_request(r, reqs, results);
      }
      remote_pending_.clear();
    }
    return "";
  }
#endif

  std::string link_after_schedule(const kvpager::step_output& out) {
#if KVPAGER_GENERATE_HAS_UCX
    if constexpr (external_kv) return link_after_schedule_external(out);
#endif
    (void)out;
    return "";
  }

#if KVPAGER_GENERATE_HAS_UCX
  std::string link_after_schedule_external(const kvpager::step_output& out) {
    if (link_ == nullptr) return "";
    for (const kvpager::seq_id id : out.external) {
      const auto x = cache_.external_blocks(id);
      if (!x || !tables_of(id, tables_)) return "external_blocks(" + std::to_string(id) + "): the cache lost it";
      const std::int64_t bs = cache_.block_size();
      const auto r = static_cast<kvpager::seq_id>(seqs_.at(id).req);
      if (std::string e = link_->start(r, tables_, x->first * bs, x->count * bs); !e.empty()) {
        // Not started (the offer does not fit, or is gone with its sender): computed here instead.
        if (const kvpager::status st = cache_.complete_external(id, false); !st) return e;
        external_.erase(static_cast<std::size_t>(r));
        link_->decline(r);
      } else {
        started_.insert(static_cast<std::size_t>(r));
      }
    }
    // An offered request admitted without waiting (its own prefix cache already had those blocks, or the prompt
    // has no full block to take) computes here: the sender need not hold it any longer.
    for (const kvpager::scheduled_sequence& e : out.scheduled) {
      const auto r = static_cast<std::size_t>(seqs_.at(e.id).req);
      const auto it = external_.find(r);
      if (it == external_.end() || it->second != e.id) continue;
      if (started_.erase(r) == 0) link_->decline(static_cast<kvpager::seq_id>(r));
      external_.erase(it);
    }
    return "";
  }

  void release_held(std::size_t r) {
    const auto it = held_.find(r);
    if (it == held_.end()) return;
    (void)sched_.release(it->second);
    held_.erase(it);
    ++link_->stats().released;
  }
  disagg_link* link_ = nullptr;
  std::map<std::size_t, kvpager::seq_id> held_;      ///< prefill: request -> its held sequence
  std::vector<std::span<const kvpager::block_id>> tables_;  ///< a sequence's block tables (offers, reads)
  std::map<std::size_t, kvpager::seq_id> external_;  ///< decode: request -> its sequence waiting for its KV
  std::set<std::size_t> started_;                    ///< decode: requests whose read is started
  std::vector<std::size_t> remote_pending_;          ///< decode: requests of this share not offered yet
#endif
  std::chrono::steady_clock::time_point last_link_event_{};

  transformer& m_;
  Cache& cache_;
  kvpager::step_executor& exec_;
  paged_attention& attn_;
  kvpager::scheduler<Cache> sched_;
  engine_options o_;
  engine_stats st_;
  std::unordered_map<kvpager::seq_id, seq> seqs_;
  kvpager::seq_id next_id_ = 1;
  std::int64_t live_ = 0, done_ = 0, total_ = 0;
  std::vector<std::pair<float, std::int32_t>> scratch_;
  std::vector<kvpager::seq_id> awaiting_;
};

}  // namespace kvgen
