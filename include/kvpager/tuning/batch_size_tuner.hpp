// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Dynamic max batch size (the seed's 3.3.5 auto-tuning, point 1): the most running requests a scheduler admits up
/// to, lowered when KV utilization stays above a high threshold or a step preempts (less OOM risk), raised when it
/// stays below a low one (more throughput). A small value-type policy: plain signals in, a limit out; it allocates
/// nothing and every call is noexcept.
///
/// The controller is additive-increase, multiplicative-decrease with hysteresis in level and in time:
/// - level: between low_utilization and high_utilization (the seed's healthy band, 60-90%) nothing changes;
/// - time: a utilization signal must hold for patience_steps consecutive steps before it acts, and after any change
///   the limit holds for cooldown_steps steps whatever the signals (a preemption included).
/// On a steady load the limit therefore settles: once utilization is inside the band it stays put, and a single
/// growth step (grow_step requests) moves utilization by less than the band is wide for any load where one request
/// holds under (high - low) / grow_step of the pool, so growth stops inside the band instead of overshooting it.

#include <algorithm>
#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Configuration of batch_size_tuner; a plain value, part of scheduler_config (scheduler_config::batch_tuning).
struct batch_size_tuning {
  bool enabled = false;             ///< off: the scheduler's limit is scheduler_config::max_num_seqs alone
  std::int32_t min_seqs = 1;        ///< the limit never goes below this (>= 1)
  std::int32_t max_seqs = 256;      ///< nor above this (>= min_seqs); the scheduler also caps it at max_num_seqs
  std::int32_t initial_seqs = 0;    ///< the limit at start; 0 = max_seqs (start open, as without tuning)
  double low_utilization = 0.60;    ///< grow when utilization stays below this (the seed's healthy band: 60%)
  double high_utilization = 0.90;   ///< shrink when utilization stays above this (the band's top: 90%)
  std::int32_t shrink_permille = 750;  ///< a shrink keeps this share of the limit (at least one request less)
  std::int32_t grow_step = 1;          ///< a growth adds this many requests
  std::int32_t patience_steps = 3;     ///< consecutive steps a utilization signal must hold before it acts (>= 1)
  std::int32_t cooldown_steps = 8;     ///< steps after a change during which nothing changes (>= 0)

  /// errc::invalid_argument naming the first bad field: bounds (1 <= min_seqs <= max_seqs, initial_seqs 0 or
  /// within them), thresholds (0 <= low < high <= 1, not NaN), shrink_permille in [0, 1000), grow_step >= 1,
  /// patience_steps >= 1, cooldown_steps >= 0. Checked whether or not `enabled`.
  [[nodiscard]] constexpr status validate() const noexcept {
    if (min_seqs < 1) return status{errc::invalid_argument, "batch_size_tuning: min_seqs must be at least 1", min_seqs};
    if (max_seqs < min_seqs)
      return status{errc::invalid_argument, "batch_size_tuning: max_seqs must be at least min_seqs", max_seqs};
    if (initial_seqs != 0 && (initial_seqs < min_seqs || initial_seqs > max_seqs))
      return status{errc::invalid_argument, "batch_size_tuning: initial_seqs must be 0 or within [min_seqs, max_seqs]",
                    initial_seqs};
    if (!(low_utilization >= 0.0 && low_utilization < high_utilization && high_utilization <= 1.0))
      return status{errc::invalid_argument,
                    "batch_size_tuning: thresholds must satisfy 0 <= low_utilization < high_utilization <= 1"};
    if (shrink_permille < 0 || shrink_permille >= 1000)
      return status{errc::invalid_argument, "batch_size_tuning: shrink_permille must be in [0, 1000)",
                    shrink_permille};
    if (grow_step < 1)
      return status{errc::invalid_argument, "batch_size_tuning: grow_step must be at least 1", grow_step};
    if (patience_steps < 1)
      return status{errc::invalid_argument, "batch_size_tuning: patience_steps must be at least 1", patience_steps};
    if (cooldown_steps < 0)
      return status{errc::invalid_argument, "batch_size_tuning: cooldown_steps must not be negative", cooldown_steps};
    return ok_status();
  }
};

/// What one batch_size_tuner::update did.
enum class batch_size_change : std::uint8_t {
  hold,    ///< limit unchanged
  shrink,  ///< limit lowered
  grow,    ///< limit raised
};

/// The dynamic max batch size. A default-constructed tuner is disabled (limit() is INT32_MAX, update() holds).
class batch_size_tuner {
 public:
  constexpr batch_size_tuner() noexcept = default;

  /// A tuner for `cfg`, which must pass cfg.validate() (create() checks it); a config that does not, or one not
  /// `enabled`, gives a disabled tuner.
  explicit constexpr batch_size_tuner(const batch_size_tuning& cfg) noexcept {
    if (!cfg.enabled || !cfg.validate()) return;
    cfg_ = cfg;
    enabled_ = true;
    limit_ = cfg.initial_seqs == 0 ? cfg.max_seqs : cfg.initial_seqs;
  }

  /// A tuner for `cfg`; errors: cfg.validate()'s.
  [[nodiscard]] static constexpr result<batch_size_tuner> create(const batch_size_tuning& cfg) noexcept {
    if (const status st = cfg.validate(); !st) return st;
    return batch_size_tuner(cfg);
  }

  [[nodiscard]] constexpr bool enabled() const noexcept { return enabled_; }
  /// The most running requests now (INT32_MAX when disabled).
  [[nodiscard]] constexpr std::int32_t limit() const noexcept { return enabled_ ? limit_ : INT32_MAX; }
  [[nodiscard]] constexpr const batch_size_tuning& config() const noexcept { return cfg_; }
  [[nodiscard]] constexpr std::int64_t shrinks() const noexcept { return shrinks_; }
  [[nodiscard]] constexpr std::int64_t grows() const noexcept { return grows_; }

  /// One step's signals: KV `utilization` (used / usable blocks, a fraction; NaN counts as inside the band) and
  /// the `preemptions` the step made. Shrinks at once on a preemption, after patience_steps steps above
  /// high_utilization; grows after patience_steps steps below low_utilization; never within cooldown_steps of
  /// the last change, never past [min_seqs, max_seqs]. Returns what it did.
  constexpr batch_size_change update(double utilization, std::int32_t preemptions) noexcept {
    if (!enabled_) return batch_size_change::hold;
    const bool high = utilization > cfg_.high_utilization;
    const bool low = utilization < cfg_.low_utilization;
    above_ = high ? above_ + 1 : 0;
    below_ = low ? below_ + 1 : 0;
    if (cooldown_ > 0) {
      --cooldown_;
      return batch_size_change::hold;
    }
    if (preemptions > 0 || above_ >= cfg_.patience_steps) {
      const std::int64_t scaled = std::int64_t{limit_} * cfg_.shrink_permille / 1000;
      const auto next = static_cast<std::int32_t>(std::max<std::int64_t>(cfg_.min_seqs, std::min<std::int64_t>(
                                                                                            scaled, limit_ - 1)));
      return change(next, batch_size_change::shrink);
    }
    if (below_ >= cfg_.patience_steps) {
      const auto next =
          static_cast<std::int32_t>(std::min<std::int64_t>(cfg_.max_seqs, std::int64_t{limit_} + cfg_.grow_step));
      return change(next, batch_size_change::grow);
    }
    return batch_size_change::hold;
  }

 private:
  constexpr batch_size_change change(std::int32_t next, batch_size_change kind) noexcept {
    if (next == limit_) return batch_size_change::hold;  // at a bound: no change, no cooldown
    limit_ = next;
    above_ = 0;
    below_ = 0;
    cooldown_ = cfg_.cooldown_steps;
    ++(kind == batch_size_change::shrink ? shrinks_ : grows_);
    return kind;
  }

  batch_size_tuning cfg_{};
  bool enabled_ = false;
  std::int32_t limit_ = INT32_MAX;
  std::int32_t above_ = 0;     ///< consecutive steps above high_utilization
  std::int32_t below_ = 0;     ///< consecutive steps below low_utilization
  std::int32_t cooldown_ = 0;  ///< steps left without a change
  std::int64_t shrinks_ = 0;
  std::int64_t grows_ = 0;
};

KVPAGER_NAMESPACE_END
