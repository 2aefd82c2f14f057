// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Priority aging (the seed's 3.3.5 auto-tuning, point 2: a request that waits too long gains priority, so none
/// starves), with the bound on the longest wait it guarantees. A plain value type: the scheduler ages its waiting
/// requests with tick() once per step (scheduler_config::aging_steps is its steps_per_level), and an operator sizes
/// steps_per_level from wait_bound().
///
/// The bound. Take a scheduler admitting in (aged) priority order, first come first served among equals
/// (admission_order::priority), and a request R waiting in it. Let
/// - k = steps_per_level >= 1 (a waiting request gains one level per k steps it waits),
/// - P = the priority spread: no other request has a priority above R's priority + P (P >= 0),
/// - W = the requests already waiting when R arrives,
/// - A = the most requests that join the waiting queue between two steps while R waits.
/// A request X that joins s steps after R (R has been aged s times then) has, at every later step, a boost smaller
/// than R's by at least floor(s / k): both gain a level every k steps. Once s >= k * P, X's effective priority is
/// never above R's, and X joined behind R, so R stays ahead of it (the order is stable among equals). So only the
/// W requests queued before R and those joining in R's first k * P steps, at most A * k * P, can be admitted
/// before R: at most W + A * k * P overtakers (max_overtakers). Admission takes the queue in order, so each
/// admission while R waits is R or one of them; if at least one waiting request is admitted every S steps while
/// R waits (the load model: S = 1 when a request finishes every step), R is admitted within
/// S * (W + A * k * P + 1) steps (wait_bound). The bound is reached: with A requests of priority p_R + P joining
/// before every step and one admitted per step, R is admitted at step W + A * k * P + 1 exactly
/// (TunedScheduler.AgingBoundsTheLongestWaitAndTheAdversaryReachesIt, tests/sched/tuning_test.cpp).
/// Without aging (k = 0) and with P > 0 and A > 0 there is no bound: R can starve.
///
/// A recompute victim re-enters at the front of the waiting queue with its aging reset; count each re-entry in A,
/// and since it stands in front of its equals, in a window of k * (P + 1) steps rather than k * P (pass
/// `front_entries`).

#include <cstdint>
#include <optional>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Linear priority aging: one level per steps_per_level steps waited; 0 = no aging.
struct priority_aging {
  std::int32_t steps_per_level = 0;

  [[nodiscard]] constexpr bool enabled() const noexcept { return steps_per_level > 0; }

  /// errc::invalid_argument for a negative steps_per_level.
  [[nodiscard]] constexpr status validate() const noexcept {
    if (steps_per_level < 0)
      return status{errc::invalid_argument, "priority_aging: steps_per_level must not be negative (0 = no aging)",
                    steps_per_level};
    return ok_status();
  }

  /// Levels gained after waiting `waited_steps` steps (0 without aging or for a negative count).
  [[nodiscard]] constexpr std::int64_t boost(std::int64_t waited_steps) const noexcept {
    return enabled() && waited_steps > 0 ? waited_steps / steps_per_level : 0;
  }

  /// One step of waiting for a request whose counters are `waited` (steps since its last level) and `aged` (levels
  /// gained, saturating at INT64_MAX). Keeps aged == boost(steps waited) for a request aged from zero.
  constexpr void tick(std::int32_t& waited, std::int64_t& aged) const noexcept {
    if (!enabled()) return;
    if (++waited >= steps_per_level) {
      waited = 0;
      if (aged < INT64_MAX) ++aged;
    }
  }

  /// The most requests admitted before a waiting request (see the file comment): `queued_ahead` (W) waiting when it
  /// arrived, at most `entries_per_step` (A) joining between two steps, no priority more than `spread` (P) above
  /// its own. With `front_entries` (recompute victims re-entering in front) the window is k * (P + 1) steps. None
  /// when there is no bound (no aging, P > 0 and A > 0) or it overflows 64 bits; negative inputs count as 0.
  [[nodiscard]] constexpr std::optional<std::int64_t> max_overtakers(std::int64_t queued_ahead,
                                                                     std::int64_t entries_per_step,
                                                                     std::int64_t spread,
                                                                     bool front_entries = false) const noexcept {
    const std::int64_t w = queued_ahead > 0 ? queued_ahead : 0;
    const std::int64_t a = entries_per_step > 0 ? entries_per_step : 0;
    const std::int64_t p = spread > 0 ? spread : 0;
    if (front_entries && p == INT64_MAX) return std::nullopt;
    const std::int64_t levels = front_entries ? p + 1 : p;
    if (a == 0 || levels == 0) return w;
    if (!enabled()) return std::nullopt;
    const std::int64_t window = mul_or_negative(levels, steps_per_level);
    const std::int64_t late = window < 0 ? -1 : mul_or_negative(window, a);
    if (late < 0 || w > INT64_MAX - late) return std::nullopt;
    return w + late;
  }

  /// The longest wait, in steps, of a request under the load model of the file comment: max_overtakers(...) + 1
  /// admissions, one at least every `steps_per_admission` (S >= 1) steps. None when max_overtakers has none, for
  /// S < 1, or on overflow.
  [[nodiscard]] constexpr std::optional<std::int64_t> wait_bound(std::int64_t queued_ahead,
                                                                 std::int64_t entries_per_step, std::int64_t spread,
                                                                 std::int64_t steps_per_admission,
                                                                 bool front_entries = false) const noexcept {
    if (steps_per_admission < 1) return std::nullopt;
    const auto n = max_overtakers(queued_ahead, entries_per_step, spread, front_entries);
    if (!n || *n == INT64_MAX) return std::nullopt;
    const std::int64_t steps = mul_or_negative(*n + 1, steps_per_admission);
    if (steps < 0) return std::nullopt;
    return steps;
  }

 private:
  /// x * y for x, y >= 0; -1 if it does not fit 64 bits.
  [[nodiscard]] static constexpr std::int64_t mul_or_negative(std::int64_t x, std::int64_t y) noexcept {
    return y != 0 && x > INT64_MAX / y ? -1 : x * y;
  }
};

KVPAGER_NAMESPACE_END
