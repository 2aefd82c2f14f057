// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// block_size_advisor: recommends a block size from observed request lengths. The seed (3.3.5, auto-tuning point 4)
/// and vLLM #6868 describe the trade: a small block wastes few token slots in each sequence's last, partial block
/// (internal fragmentation), a large block needs fewer block-table entries and less per-block bookkeeping (and
/// fewer, longer runs for the attention kernel to gather). The advisor is fed each finished request's prompt and
/// output lengths and keeps, for each candidate block size (8, 16, 32, 64), running sums of:
///
/// - internal waste over the sequence's life: while it grows from `prompt` to `prompt + output` tokens (prefill,
///   then one token per decode step), the allocated but empty slots of its last block, (-length) mod block_size at
///   each length, summed in closed form (no per-token loop); its waste fraction is wasted slots / allocated slots;
/// - block-table overhead at the final length: ceil(length / block_size) entries of 4 bytes (int32 block ids), plus
///   `block_metadata_bytes` per block if the engine wants its per-block bookkeeping counted.
///
/// Memory is bounded: a few numbers per candidate, whatever the number of observations (optionally decayed, so
/// that old traffic fades). recommend() returns the largest block size, among those the caller's predicate accepts
/// (the kernels' block sizes: kernels_run_block_size in kernel_block_sizes.hpp), whose waste fraction is at most
/// max_waste_fraction: the least table overhead within the waste tolerance; if none is within it, the one with the
/// least waste. Never throws; allocates nothing.

#include <array>
#include <cstddef>
#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// The block sizes the advisor compares, ascending.
inline constexpr std::array<std::int32_t, 4> advisor_block_sizes{8, 16, 32, 64};

/// Advisor settings.
struct block_size_advisor_config {
  double max_waste_fraction = 0.03;     ///< tolerated wasted slots / allocated slots over the sequences' lives
  std::int32_t block_metadata_bytes = 0;  ///< per-block bookkeeping counted with each 4-byte table entry
  double decay = 1.0;  ///< each observation first scales the sums by this, in (0, 1]; 1 = every request weighs the same
};

/// The advisor's estimate for one block size, per observed request (weighted means when decay < 1).
struct block_size_estimate {
  std::int32_t block_size = 0;
  double waste_fraction = 0;        ///< wasted slots / allocated slots, over every length each request passed through
  double mean_waste_slots = 0;      ///< empty slots of the last block at the final length
  double mean_table_entries = 0;    ///< block-table entries at the final length
  double mean_table_bytes = 0;      ///< mean_table_entries x (4 + block_metadata_bytes)
};

class block_size_advisor {
 public:
  /// An advisor with no observations. A config outside its range (max_waste_fraction < 0, block_metadata_bytes < 0,
  /// decay not in (0, 1]) is clamped into it: see config().
  explicit constexpr block_size_advisor(block_size_advisor_config cfg = {}) noexcept : cfg_(cfg) {
    if (!(cfg_.max_waste_fraction >= 0)) cfg_.max_waste_fraction = 0;
    if (cfg_.block_metadata_bytes < 0) cfg_.block_metadata_bytes = 0;
    if (!(cfg_.decay > 0 && cfg_.decay <= 1)) cfg_.decay = 1;
  }

  [[nodiscard]] constexpr const block_size_advisor_config& config() const noexcept { return cfg_; }
  /// Requests observed (since construction or reset()).
  [[nodiscard]] constexpr std::int64_t observations() const noexcept { return count_; }

  /// Records a request of `prompt_len` prompt and `output_len` generated tokens. Errors (errc::invalid_argument,
  /// nothing recorded): prompt_len <= 0, output_len < 0, a total beyond 2^31 - 1 tokens.
  constexpr status observe(std::int64_t prompt_len, std::int64_t output_len) noexcept {
    if (prompt_len <= 0) return status{errc::invalid_argument, "block_size_advisor::observe: prompt_len must be positive", prompt_len};
    if (output_len < 0)
      return status{errc::invalid_argument, "block_size_advisor::observe: output_len must not be negative", output_len};
    if (prompt_len + output_len > std::int64_t{0x7fffffff})
      return status{errc::invalid_argument, "block_size_advisor::observe: a request beyond 2^31 - 1 tokens",
                    prompt_len + output_len};
    const std::int64_t first = prompt_len;
    const std::int64_t last = prompt_len + output_len;
    // Tokens held, summed over the lengths first..last.
    const double tokens = static_cast<double>(output_len + 1) * static_cast<double>(first + last) / 2.0;
    weight_ = weight_ * cfg_.decay + 1.0;
    for (std::size_t i = 0; i < advisor_block_sizes.size(); ++i) {
      const std::int64_t b = advisor_block_sizes[i];
      const auto waste = static_cast<double>(waste_prefix(last, b) - waste_prefix(first - 1, b));
      sums& s = sums_[i];
      s.waste_slots = s.waste_slots * cfg_.decay + waste;
      s.allocated_slots = s.allocated_slots * cfg_.decay + tokens + waste;
      s.final_waste = s.final_waste * cfg_.decay + static_cast<double>((b - last % b) % b);
      s.final_entries = s.final_entries * cfg_.decay + static_cast<double>((last + b - 1) / b);
    }
    ++count_;
    return ok_status();
  }

  /// The estimate for advisor_block_sizes[i] (i < advisor_block_sizes.size()); all zero but block_size before the
  /// first observation.
  [[nodiscard]] constexpr block_size_estimate estimate(std::size_t i) const noexcept {
    block_size_estimate e;
    e.block_size = advisor_block_sizes[i];
    if (count_ == 0) return e;
    const sums& s = sums_[i];
    e.waste_fraction = s.allocated_slots > 0 ? s.waste_slots / s.allocated_slots : 0;
    e.mean_waste_slots = s.final_waste / weight_;
    e.mean_table_entries = s.final_entries / weight_;
    e.mean_table_bytes = e.mean_table_entries * (4.0 + cfg_.block_metadata_bytes);
    return e;
  }

  /// The recommended block size among the candidates `supported(block_size)` accepts (see the file comment).
  /// Errors: errc::invalid_argument (no observation yet), errc::unsupported (the predicate accepts no candidate).
  template <class Supported>
  [[nodiscard]] constexpr result<std::int32_t> recommend(Supported&& supported) const noexcept(noexcept(supported(0))) {
    if (count_ == 0) return status{errc::invalid_argument, "block_size_advisor::recommend: nothing observed yet"};
    std::int32_t within = 0;      // largest supported candidate within the tolerance
    std::int32_t least = 0;       // supported candidate with the least waste (the smallest on ties)
    double least_waste = 2.0;
    for (std::size_t i = 0; i < advisor_block_sizes.size(); ++i) {
      if (!supported(advisor_block_sizes[i])) continue;
      const double w = estimate(i).waste_fraction;
      if (w <= cfg_.max_waste_fraction) within = advisor_block_sizes[i];
      if (w < least_waste) {
        least_waste = w;
        least = advisor_block_sizes[i];
      }
    }
    if (least == 0)
      return status{errc::unsupported, "block_size_advisor::recommend: no candidate block size is supported"};
    return within != 0 ? within : least;
  }
  /// recommend() over every candidate (8, 16, 32, 64), supported or not.
  [[nodiscard]] constexpr result<std::int32_t> recommend() const noexcept {
    return recommend([](std::int32_t) noexcept { return true; });
  }

  /// Forgets every observation; the config stays.
  constexpr void reset() noexcept {
    sums_ = {};
    weight_ = 0;
    count_ = 0;
  }

 private:
  struct sums {
    double waste_slots = 0;      // empty slots, summed over every length of every request
    double allocated_slots = 0;  // allocated slots, same sum
    double final_waste = 0;      // empty slots at the final length
    double final_entries = 0;    // table entries at the final length
  };

  // Sum over lengths 1..n of the empty slots in the last block, (-length) mod b: each full cycle of b lengths
  // contributes b(b-1)/2, the remaining r lengths r*b - r(r+1)/2. 0 for n <= 0. Exact in 64 bits for n < 2^31.
  [[nodiscard]] static constexpr std::int64_t waste_prefix(std::int64_t n, std::int64_t b) noexcept {
    if (n <= 0) return 0;
    const std::int64_t r = n % b;
    return (n / b) * (b * (b - 1) / 2) + r * b - r * (r + 1) / 2;
  }

  block_size_advisor_config cfg_;
  std::array<sums, advisor_block_sizes.size()> sums_{};
  double weight_ = 0;  // observations, decayed as the sums
  std::int64_t count_ = 0;
};

KVPAGER_NAMESPACE_END
