// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Adaptive swap-or-recompute (the seed's 3.3.5 auto-tuning, point 3, "adaptive swap threshold"): for each
/// preemption, swap the victim to the host pool or drop its KV and recompute it, whichever the cost model says is
/// cheaper, with a penalty on swapping that grows with how often swaps happened lately.
///
///   swap cost      = 2 x blocks x block_bytes / link bandwidth          (out now, back in later)
///                    x (1 + frequency_penalty x swap rate)              (the adaptive threshold)
///   recompute cost = tokens x prefill seconds per token
///
/// The link bandwidth and the prefill time per token start at the configured values and follow measurements the
/// engine reports (observe_transfer, observe_prefill: exponential moving averages). The swap rate is the moving
/// average of swap-outs per step (end_step): when swaps come often they queue on the link and stall steps on their
/// way back in (vLLM issues #12, #546), so each one must save more to be chosen. The scheduler uses it with
/// preemption_mode::adaptive (scheduler_config::swap_cost). A value type; nothing allocates, every call is
/// noexcept.

#include <cstdint>

#include "kvpager/core/checked_math.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/float_checks.hpp"
#include "kvpager/core/geometry.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Bytes one block of geometry `g` holds over `num_layers` layers, keys and values: core's block_bytes (checked; 0
/// for a non-positive size and for a block whose bytes do not fit in int64, which validate() then refuses).
/// Llama-2-7B in fp16 (32 layers, 32 KV heads, head dim 128, 16 tokens a block): 8 MiB.
[[nodiscard]] constexpr std::int64_t kv_block_bytes(const kv_geometry& g, std::int32_t num_layers) noexcept {
  return block_bytes(g, num_layers);
}

/// Configuration of adaptive_preemption; a plain value, part of scheduler_config (scheduler_config::swap_cost).
struct swap_cost_model {
  std::int64_t block_bytes = 0;               ///< bytes of one block, every layer, K and V (kv_block_bytes); > 0
  double link_bytes_per_second = 25.0e9;      ///< host link bandwidth each way (PCIe 4.0 x16 moves ~25 GB/s); > 0
  double prefill_seconds_per_token = 0.0;     ///< time to recompute one token's KV (a prefill's time / tokens); > 0
  double frequency_penalty = 1.0;             ///< swap cost x (1 + this x swap-outs per step, averaged); >= 0
  double rate_smoothing = 0.1;                ///< weight of one step in the swap rate's moving average, (0, 1]
  double measurement_smoothing = 0.25;        ///< weight of one measurement in the bandwidth and prefill averages

  /// errc::invalid_argument naming the first bad field (NaN and infinities included).
  [[nodiscard]] status validate() const noexcept {
    if (block_bytes <= 0)
      return status{errc::invalid_argument, "swap_cost_model: block_bytes must be positive (kv_block_bytes)",
                    block_bytes};
    if (!positive(link_bytes_per_second))
      return status{errc::invalid_argument, "swap_cost_model: link_bytes_per_second must be positive and finite"};
    if (!positive(prefill_seconds_per_token))
      return status{errc::invalid_argument, "swap_cost_model: prefill_seconds_per_token must be positive and finite"};
    if (!(frequency_penalty >= 0.0 && detail::is_finite(frequency_penalty)))
      return status{errc::invalid_argument, "swap_cost_model: frequency_penalty must be finite and not negative"};
    if (!(rate_smoothing > 0.0 && rate_smoothing <= 1.0))
      return status{errc::invalid_argument, "swap_cost_model: rate_smoothing must be in (0, 1]"};
    if (!(measurement_smoothing > 0.0 && measurement_smoothing <= 1.0))
      return status{errc::invalid_argument, "swap_cost_model: measurement_smoothing must be in (0, 1]"};
    return ok_status();
  }

  [[nodiscard]] static bool positive(double x) noexcept { return x > 0.0 && detail::is_finite(x); }
};

/// What a preemption should do with its victim.
enum class preempt_choice : std::uint8_t {
  swap,       ///< copy its blocks to the host pool, copy them back on resume
  recompute,  ///< free its blocks, compute its tokens again on resume
};

/// The adaptive swap-or-recompute policy: the model's configuration plus what it has observed.
class adaptive_preemption {
 public:
  /// A policy for `model`, which must pass model.validate() (create() checks it). With one that does not,
  /// choose() always answers recompute (vLLM v1's only mode).
  explicit adaptive_preemption(const swap_cost_model& model = {}) noexcept
      : model_(model), valid_(model.validate().ok()), bandwidth_(model.link_bytes_per_second),
        prefill_(model.prefill_seconds_per_token) {}

  /// A policy for `model`; errors: model.validate()'s.
  [[nodiscard]] static result<adaptive_preemption> create(const swap_cost_model& model) noexcept {
    if (const status st = model.validate(); !st) return st;
    return adaptive_preemption(model);
  }

  [[nodiscard]] const swap_cost_model& model() const noexcept { return model_; }
  /// The link bandwidth in use, bytes per second (configured, then measured).
  [[nodiscard]] double link_bytes_per_second() const noexcept { return bandwidth_; }
  /// The recompute time per token in use, seconds (configured, then measured).
  [[nodiscard]] double prefill_seconds_per_token() const noexcept { return prefill_; }
  /// Swap-outs per step, moving average.
  [[nodiscard]] double swap_rate() const noexcept { return rate_; }
  /// The factor on the raw swap cost: 1 + frequency_penalty x swap_rate().
  [[nodiscard]] double swap_penalty() const noexcept { return 1.0 + model_.frequency_penalty * rate_; }

  /// Seconds to swap `blocks` blocks out and back in, penalty included (infinity for an invalid model).
  [[nodiscard]] double swap_seconds(std::int64_t blocks) const noexcept {
    if (!valid_) return detail::infinity;  // no usable model: never cheaper than recompute
    const double bytes = 2.0 * static_cast<double>(blocks > 0 ? blocks : 0) * static_cast<double>(model_.block_bytes);
    return bytes / bandwidth_ * swap_penalty();
  }
  /// Seconds to compute `tokens` tokens again.
  [[nodiscard]] double recompute_seconds(std::int64_t tokens) const noexcept {
    return static_cast<double>(tokens > 0 ? tokens : 0) * prefill_;
  }

  /// The cheaper way to preempt a victim holding `blocks` blocks for `tokens` computed tokens: swap only when it
  /// costs strictly less (recompute needs no host pool, so it wins ties and an invalid model).
  [[nodiscard]] preempt_choice choose(std::int64_t blocks, std::int64_t tokens) const noexcept {
    if (!valid_) return preempt_choice::recompute;
    return swap_seconds(blocks) < recompute_seconds(tokens) ? preempt_choice::swap : preempt_choice::recompute;
  }

  /// The engine measured a host transfer of `bytes` bytes in `seconds`: the bandwidth average follows it.
  /// errc::invalid_argument (nothing changed) for a non-positive or non-finite value.
  status observe_transfer(std::int64_t bytes, double seconds) noexcept {
    if (bytes <= 0 || !swap_cost_model::positive(seconds))
      return status{errc::invalid_argument, "observe_transfer: bytes and seconds must be positive and finite"};
    const double bw = static_cast<double>(bytes) / seconds;
    if (!swap_cost_model::positive(bw)) return status{errc::invalid_argument, "observe_transfer: bandwidth overflows"};
    bandwidth_ += smoothing() * (bw - bandwidth_);
    return ok_status();
  }

  /// The engine measured a prefill of `tokens` tokens in `seconds`: the per-token recompute average follows it.
  /// errc::invalid_argument (nothing changed) for a non-positive or non-finite value.
  status observe_prefill(std::int64_t tokens, double seconds) noexcept {
    if (tokens <= 0 || !swap_cost_model::positive(seconds))
      return status{errc::invalid_argument, "observe_prefill: tokens and seconds must be positive and finite"};
    prefill_ += smoothing() * (seconds / static_cast<double>(tokens) - prefill_);
    return ok_status();
  }

  /// Sets the swap rate (a policy rebuilt with a new model keeps its history); a negative or NaN rate counts as 0.
  void restore_swap_rate(double rate) noexcept { rate_ = rate > 0.0 && detail::is_finite(rate) ? rate : 0.0; }

  /// End of a step that swapped `swap_outs` victims out (negative counts as 0): the swap rate follows.
  void end_step(std::int32_t swap_outs) noexcept {
    const double x = swap_outs > 0 ? static_cast<double>(swap_outs) : 0.0;
    rate_ += rate_weight() * (x - rate_);
  }

 private:
  [[nodiscard]] double smoothing() const noexcept { return valid_ ? model_.measurement_smoothing : 1.0; }
  [[nodiscard]] double rate_weight() const noexcept { return valid_ ? model_.rate_smoothing : 1.0; }

  swap_cost_model model_;
  bool valid_;
  double bandwidth_;
  double prefill_;
  double rate_ = 0.0;
};

KVPAGER_NAMESPACE_END
