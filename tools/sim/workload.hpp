// SPDX-License-Identifier: Apache-2.0
#pragma once
// kvpager-sim workloads: the built-in default (ShareGPT-like lengths, shared system prompts, Poisson arrivals,
// parallel sampling) and kvtrace files (docs/KVTRACE.md, parsed by tools/kvtrace/kvtrace.hpp). Everything is
// deterministic: the random numbers come from splitmix64 streams, never from a std:: distribution (whose output
// differs between standard libraries), and token ids from the kvtrace token function.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <kvpager/core/types.hpp>

#include "kvtrace.hpp"

namespace kvsim {

/// The longest max_model_len the simulator takes (an option's or a trace's): 2^24 tokens.
inline constexpr std::int32_t max_model_len_limit = 1 << 24;

/// splitmix64, the kvtrace format's mixing function.
[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ULL;
  std::uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// token(s, j) of the kvtrace format: token j of a segment (or of the outputs) with seed s.
[[nodiscard]] constexpr kvpager::token_id token_of(std::uint64_t seed, std::uint64_t j) noexcept {
  return static_cast<kvpager::token_id>(splitmix64(((seed & 0xFFFFFFFFULL) << 32) | (j & 0xFFFFFFFFULL)) % 50000);
}

/// A deterministic stream of uniform and derived random numbers.
class random_stream {
 public:
  explicit constexpr random_stream(std::uint64_t seed) noexcept : state_(seed) {}
  /// Uniform in [0, 1) with 53 bits.
  double uniform() noexcept {
    state_ += 0x9E3779B97F4A7C15ULL;
    return static_cast<double>(splitmix64(state_) >> 11) * 0x1.0p-53;
  }
  /// Standard normal (Box-Muller).
  double normal() noexcept {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  /// Log-normal with the given mean and log-space sigma: exp(mu + sigma z), mu = ln(mean) - sigma^2 / 2.
  double lognormal(double mean, double sigma) noexcept {
    return std::exp(std::log(mean) - 0.5 * sigma * sigma + sigma * normal());
  }
  /// Exponential with the given mean (Poisson inter-arrival times).
  double exponential(double mean) noexcept { return -mean * std::log(1.0 - uniform()); }

 private:
  std::uint64_t state_;
};

/// One request of a workload. Its prompt is known; its outputs are token_of(gen_seed, i); it finishes after
/// max_new outputs. `children` more samples of the same prompt (parallel sampling, n = children + 1) fork from it
/// once its first output token is sampled, each with its own generation seed and the same max_new.
struct sim_request {
  std::uint64_t id = 0;
  double arrival = 0;  ///< in steps since the start
  std::vector<kvpager::token_id> prompt;
  std::uint64_t gen_seed = 0;
  std::int32_t max_new = 1;
  std::vector<std::uint64_t> child_ids;
  std::vector<std::uint64_t> child_seeds;
};

/// A workload and the engine parameters it comes with (a kvtrace's params; the defaults' own).
struct workload {
  std::string name;
  std::vector<sim_request> requests;  ///< in arrival order
  std::int32_t block_size = 16;
  std::int32_t num_blocks = 1030;  ///< paged pool, usable blocks (kvpager-plan: Llama-2-7B on a 24 GiB card)
  std::int32_t max_model_len = 2048;
  std::int32_t max_num_seqs = 256;
  std::int64_t max_num_batched_tokens = 8192;
};

/// The default workload's knobs. Lengths follow ShareGPT as the vLLM paper (Kwon et al., SOSP 2023, figure 11)
/// describes it: mean input 161 and mean output 338 tokens, long-tailed: log-normal with those means (sigma 1.0 and
/// 0.9 in log space), clamped to [4, 1024] and [4, 1536], the sum kept within max_model_len. Most requests open
/// with one of a few system prompts (shared prefixes, as chat deployments have); some ask for several samples.
struct default_workload_options {
  std::uint64_t seed = 2023;
  std::int32_t num_requests = 400;
  double arrivals_per_step = 0.3;   ///< Poisson arrivals: mean requests per scheduler step (0: all at step 0)
  double mean_prompt = 161, prompt_sigma = 1.0;
  double mean_output = 338, output_sigma = 0.9;
  /// System prompt lengths and their popularity (weights); a request has none with the remaining probability.
  std::vector<std::int32_t> system_prompts{96, 192, 384, 160};
  std::vector<double> system_weights{0.35, 0.25, 0.15, 0.10};
  double parallel_fraction = 0.15;  ///< requests with n > 1 (n = 2, 3 or 4: 60%, 25%, 15%)
};

/// The built-in default workload (see default_workload_options).
[[nodiscard]] inline workload default_workload(const default_workload_options& o = {}) {
  workload w;
  w.name = "default";
  random_stream rng(o.seed);
  double t = 0;
  std::uint64_t next_child = 1'000'000;
  for (std::int32_t i = 0; i < o.num_requests; ++i) {
    sim_request r;
    r.id = static_cast<std::uint64_t>(i) + 1;
    r.arrival = t;
    const double gap = rng.exponential(1.0);  // drawn whatever the rate: the same requests at every rate
    if (o.arrivals_per_step > 0) t += gap / o.arrivals_per_step;
    // System prompt by popularity.
    double u = rng.uniform();
    for (std::size_t k = 0; k < o.system_prompts.size(); ++k) {
      if (u < o.system_weights[k]) {
        for (std::int32_t j = 0; j < o.system_prompts[k]; ++j)
          r.prompt.push_back(token_of(0xC0FFEE00ULL + k, static_cast<std::uint64_t>(j)));
        break;
      }
      u -= o.system_weights[k];
    }
    const auto user = static_cast<std::int32_t>(std::clamp(std::lround(rng.lognormal(o.mean_prompt, o.prompt_sigma)), 4L, 1024L));
    const std::uint64_t user_seed = 0x10000000ULL + r.id;
    for (std::int32_t j = 0; j < user; ++j) r.prompt.push_back(token_of(user_seed, static_cast<std::uint64_t>(j)));
    const auto out = std::clamp(std::lround(rng.lognormal(o.mean_output, o.output_sigma)), 4L, 1536L);
    const auto room = std::int64_t{w.max_model_len} - static_cast<std::int64_t>(r.prompt.size());
    r.max_new = static_cast<std::int32_t>(std::max<std::int64_t>(1, std::min<std::int64_t>(out, room)));
    r.gen_seed = 0x20000000ULL + r.id;
    if (rng.uniform() < o.parallel_fraction) {
      const double v = rng.uniform();
      const int n = v < 0.60 ? 2 : v < 0.85 ? 3 : 4;
      for (int c = 1; c < n; ++c) {
        r.child_ids.push_back(next_child);
        r.child_seeds.push_back(0x30000000ULL + next_child);
        ++next_child;
      }
    }
    w.requests.push_back(std::move(r));
  }
  return w;
}

/// The multi-turn chat workload's knobs: conversations that come back. Each conversation opens with a system prompt
/// (as the default workload's, by popularity) and a user message; each later turn's prompt is the whole conversation
/// so far (every earlier prompt, every answer as the simulator generates it: token_of(gen_seed, i)) and a new user
/// message, arriving a think time after the previous turn could have finished (its answer's length in steps). While
/// a conversation thinks, other conversations' turns push its blocks out of the device pool: the prefix it comes back
/// with is what a host tier keeps (docs/host_tier.md).
struct multiturn_options {
  std::uint64_t seed = 2023;
  std::int32_t num_requests = 400;     ///< turns over all conversations
  double conversations_per_step = 0.05;  ///< Poisson arrivals of new conversations (0: all start at step 0)
  double mean_turns = 4;               ///< turns per conversation: geometric with this mean, 1 to max_turns
  std::int32_t max_turns = 8;
  double mean_first = 161, first_sigma = 1.0;  ///< the first user message (ShareGPT-like), [4, 1024]
  double mean_next = 60, next_sigma = 0.8;     ///< later user messages, [4, 512]
  double mean_output = 120, output_sigma = 0.8;  ///< answers, [4, 512]
  double mean_think = 300;             ///< steps between an answer and the next turn (exponential)
  std::vector<std::int32_t> system_prompts{96, 192, 384, 160};
  std::vector<double> system_weights{0.35, 0.25, 0.15, 0.10};
  std::int32_t max_model_len = 2048;   ///< a turn whose prompt and answer would not fit ends its conversation
};

/// The built-in multi-turn workload (see multiturn_options): requests in arrival order, ids 1, 2, ... by
/// conversation and turn. A conversation ends early when its next turn would not fit max_model_len.
[[nodiscard]] inline workload multiturn_workload(const multiturn_options& o = {}) {
  workload w;
  w.name = "multiturn";
  w.max_model_len = o.max_model_len;
  random_stream rng(o.seed);
  double start = 0;
  std::uint64_t id = 0;
  std::int32_t turns_left = o.num_requests;
  // Bounded: lengths that rarely fit max_model_len end the generation with fewer turns, never hang it.
  const std::uint64_t max_conversations = 64 * static_cast<std::uint64_t>(o.num_requests) + 1024;
  for (std::uint64_t conv = 0; turns_left > 0 && conv < max_conversations; ++conv) {
    const double gap = rng.exponential(1.0);
    if (o.conversations_per_step > 0) start += gap / o.conversations_per_step;
    std::int32_t turns = 1;
    while (turns < o.max_turns && rng.uniform() >= 1.0 / o.mean_turns) ++turns;
    turns = std::min(turns, turns_left);
    std::vector<kvpager::token_id> context;
    double u = rng.uniform();
    for (std::size_t k = 0; k < o.system_prompts.size(); ++k) {
      if (u < o.system_weights[k]) {
        for (std::int32_t j = 0; j < o.system_prompts[k]; ++j)
          context.push_back(token_of(0xC0FFEE00ULL + k, static_cast<std::uint64_t>(j)));
        break;
      }
      u -= o.system_weights[k];
    }
    double arrival = start;
    for (std::int32_t t = 0; t < turns; ++t) {
      const auto user = static_cast<std::int32_t>(
          t == 0 ? std::clamp(std::lround(rng.lognormal(o.mean_first, o.first_sigma)), 4L, 1024L)
                 : std::clamp(std::lround(rng.lognormal(o.mean_next, o.next_sigma)), 4L, 512L));
      const auto out = static_cast<std::int32_t>(std::clamp(std::lround(rng.lognormal(o.mean_output, o.output_sigma)), 4L, 512L));
      const double think = rng.exponential(o.mean_think);
      if (static_cast<std::int64_t>(context.size()) + user + out > w.max_model_len) break;
      sim_request r;
      r.id = ++id;
      r.arrival = arrival;
      const std::uint64_t user_seed = 0x40000000ULL + r.id;
      for (std::int32_t j = 0; j < user; ++j) context.push_back(token_of(user_seed, static_cast<std::uint64_t>(j)));
      r.prompt = context;
      r.max_new = out;
      r.gen_seed = 0x50000000ULL + r.id;
      for (std::int32_t j = 0; j < out; ++j) context.push_back(token_of(r.gen_seed, static_cast<std::uint64_t>(j)));
      arrival += out + think;  // its answer takes at least one step a token
      w.requests.push_back(std::move(r));
      --turns_left;
    }
  }
  std::stable_sort(w.requests.begin(), w.requests.end(),
                   [](const sim_request& a, const sim_request& b) { return a.arrival < b.arrival; });
  return w;
}

/// A workload from a manager-level kvtrace: every `req` is a request (its segments the prompt, its gen seed and
/// max_new), every `fork` another sample of its parent. All arrive at step 0, as a `run` queues them, unless
/// `arrivals_per_step` > 0 spreads them as Poisson arrivals. A request with max_new 0 (driven by explicit ops)
/// gets 1 + the tokens its `decode` ops ask for. Params: num_blocks (less the null block), block_size,
/// max_model_len (at most max_model_len_limit; 0 or less: not bounded by the trace, so the longest sequence its
/// requests reach, prompt plus outputs), max_num_seqs, max_num_batched_tokens. Returns an error message, or "" with
/// `w` filled.
[[nodiscard]] inline std::string workload_from_trace(const kvreplay::trace& t, double arrivals_per_step,
                                                     std::uint64_t seed, workload& w) {
  if (t.level != "manager") return "kvpager-sim needs a manager-level trace (this one is level " + t.level + ")";
  w = workload{};
  w.name = t.workload.empty() ? "trace" : t.workload;
  w.block_size = static_cast<std::int32_t>(t.param("block_size", 16));
  w.num_blocks = static_cast<std::int32_t>(t.param("num_blocks", 2) - 1);
  const std::int64_t trace_max_len = std::min<std::int64_t>(t.param("max_model_len", 8192), max_model_len_limit);
  w.max_model_len = static_cast<std::int32_t>(std::max<std::int64_t>(trace_max_len, 1));
  w.max_num_seqs = static_cast<std::int32_t>(std::min<std::int64_t>(t.param("max_num_seqs", 256), INT32_MAX));
  w.max_num_batched_tokens = t.param("max_num_batched_tokens", 8192);
  std::vector<std::int64_t> decoded;  // per request index: tokens its decode ops ask for
  auto index_of = [&](std::uint64_t id) -> std::int64_t {
    for (std::size_t i = 0; i < w.requests.size(); ++i)
      if (w.requests[i].id == id) return static_cast<std::int64_t>(i);
    return -1;
  };
  for (const kvreplay::op& o : t.ops) {
    if (o.kind == kvreplay::op_kind::req) {
      sim_request r;
      r.id = o.id;
      r.gen_seed = o.gen_seed;
      for (const kvreplay::segment& s : o.segments)
        for (std::int64_t j = 0; j < s.len; ++j) r.prompt.push_back(token_of(s.seed, static_cast<std::uint64_t>(j)));
      r.max_new = static_cast<std::int32_t>(o.max_new);
      w.requests.push_back(std::move(r));
      decoded.push_back(0);
    } else if (o.kind == kvreplay::op_kind::decode) {
      if (const auto i = index_of(o.id); i >= 0) decoded[static_cast<std::size_t>(i)] += o.n;
    } else if (o.kind == kvreplay::op_kind::fork) {
      if (const auto i = index_of(o.id); i >= 0) {
        w.requests[static_cast<std::size_t>(i)].child_ids.push_back(o.child);
        w.requests[static_cast<std::size_t>(i)].child_seeds.push_back(o.gen_seed);
      }
    }
  }
  random_stream rng(seed);
  double time = 0;
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    sim_request& r = w.requests[i];
    if (r.max_new == 0) r.max_new = static_cast<std::int32_t>(std::min<std::int64_t>(1 + decoded[i], 1 << 24));
    if (arrivals_per_step > 0) {
      r.arrival = time;
      time += rng.exponential(1.0 / arrivals_per_step);
    }
  }
  if (w.requests.empty()) return "the trace defines no request";
  if (trace_max_len <= 0) {  // a valid trace that leaves max_model_len unbounded (param max_model_len 0)
    std::int64_t longest = 1;
    for (const sim_request& r : w.requests)
      longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(r.prompt.size()) + r.max_new);
    w.max_model_len = static_cast<std::int32_t>(std::min<std::int64_t>(longest, max_model_len_limit));
  }
  return "";
}

/// Totals of a workload, for the report.
struct workload_summary {
  std::int64_t requests = 0, samples = 0, prompt_tokens = 0, output_tokens = 0;
  double last_arrival = 0;
};

[[nodiscard]] inline workload_summary summarize(const workload& w) {
  workload_summary s;
  for (const sim_request& r : w.requests) {
    ++s.requests;
    const auto n = 1 + static_cast<std::int64_t>(r.child_ids.size());
    s.samples += n;
    s.prompt_tokens += static_cast<std::int64_t>(r.prompt.size());
    s.output_tokens += n * r.max_new;
    s.last_arrival = std::max(s.last_arrival, r.arrival);
  }
  return s;
}

}  // namespace kvsim
