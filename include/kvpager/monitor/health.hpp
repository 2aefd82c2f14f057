// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// health_check: the seed's health levels (3.3.5, MemoryMonitor._assess_health), with its thresholds as defaults
/// and its check order, first match wins:
///
///   CRITICAL  swaps in the window > 10, or waiting requests > 50   (add capacity)
///   WARNING   KV usage > 95%, or waiting requests > 20,            (memory is tight: watch the queue)
///             or the waiting queue grew by > 20 over the window      (a growing queue: capacity is short)
///   GOOD      KV usage > 80%                                       (efficient use)
///   OK        otherwise                                            (memory to spare)
///
/// Beside the level, the seed's healthy usage band (60-90%): below it memory is wasted, above it preemption is near.
/// The swaps, and the growth of the waiting queue (the seed's "a waiting queue that keeps growing means scale out",
/// 3.3.5, point 3), are counted from a metrics_recorder over a time window (default 5 minutes, the seed's sampling
/// interval). Checking allocates nothing and is O(log history).
///
/// \code
///   const kvpager::health_check health;  // the seed's thresholds; or health_check::create(custom)
///   const kvpager::health_report h = health.check(recorder);
///   if (h.level == kvpager::health_level::critical) page_operator(kvpager::describe(h.level));
/// \endcode

#include <chrono>
#include <cstdint>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/monitor/metrics.hpp"
#include "kvpager/monitor/recorder.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Health levels, in increasing severity.
enum class health_level : std::uint8_t { ok, good, warning, critical };

/// "OK", "GOOD", "WARNING", "CRITICAL".
[[nodiscard]] constexpr const char* to_string(health_level l) noexcept {
  switch (l) {
    case health_level::ok: return "OK";
    case health_level::good: return "GOOD";
    case health_level::warning: return "WARNING";
    case health_level::critical: return "CRITICAL";
  }
  return "UNKNOWN";
}

/// The seed's advice for a level.
[[nodiscard]] constexpr const char* describe(health_level l) noexcept {
  switch (l) {
    case health_level::ok: return "OK - running normally, memory to spare";
    case health_level::good: return "GOOD - memory used efficiently";
    case health_level::warning: return "WARNING - memory is tight, watch the waiting queue";
    case health_level::critical: return "CRITICAL - many swaps or waiting requests, add capacity";
  }
  return "UNKNOWN";
}

/// Where KV usage lies against the healthy band.
enum class utilization_band : std::uint8_t {
  below,    ///< under the band: memory is wasted (a smaller pool, or more concurrent requests, would do)
  healthy,  ///< within the band
  above,    ///< over the band: preemption and swapping are near
};

/// "below", "healthy", "above".
[[nodiscard]] constexpr const char* to_string(utilization_band b) noexcept {
  switch (b) {
    case utilization_band::below: return "below";
    case utilization_band::healthy: return "healthy";
    case utilization_band::above: return "above";
  }
  return "unknown";
}

/// Thresholds of the health levels; the defaults are the seed's. Usage is a fraction in [0, 1]
/// (metrics_snapshot::kv_cache_usage). Every comparison is strict: usage exactly 95% is not WARNING.
struct health_thresholds {
  std::int64_t critical_swaps = 10;    ///< CRITICAL when swaps in the window exceed this
  std::int64_t critical_waiting = 50;  ///< CRITICAL when waiting requests exceed this
  double warning_usage = 0.95;         ///< WARNING when KV usage exceeds this
  std::int64_t warning_waiting = 20;   ///< WARNING when waiting requests exceed this
  /// WARNING when the waiting queue grew by more than this over the window (newest minus the window's first
  /// sample); INT64_MAX turns the rule off.
  std::int64_t warning_waiting_growth = 20;
  double good_usage = 0.80;            ///< GOOD when KV usage exceeds this
  double band_low = 0.60;              ///< the healthy usage band, inclusive
  double band_high = 0.90;
  std::chrono::nanoseconds window = std::chrono::minutes(5);  ///< the span swaps are counted over
  friend bool operator==(const health_thresholds&, const health_thresholds&) = default;
};

/// errc::invalid_argument for a usage threshold outside [0, 1] (or NaN), band_low > band_high, a negative count
/// threshold or a negative window.
[[nodiscard]] constexpr status validate(const health_thresholds& t) noexcept {
  const auto fraction = [](double x) { return x >= 0.0 && x <= 1.0; };  // false for NaN
  if (!fraction(t.warning_usage) || !fraction(t.good_usage) || !fraction(t.band_low) || !fraction(t.band_high))
    return status{errc::invalid_argument, "health_thresholds: usage thresholds must be fractions in [0, 1]"};
  if (t.band_low > t.band_high)
    return status{errc::invalid_argument, "health_thresholds: band_low must not exceed band_high"};
  if (t.critical_swaps < 0 || t.critical_waiting < 0 || t.warning_waiting < 0 || t.warning_waiting_growth < 0)
    return status{errc::invalid_argument, "health_thresholds: count thresholds must be >= 0"};
  if (t.window.count() < 0) return status{errc::invalid_argument, "health_thresholds: window must be >= 0"};
  return ok_status();
}

/// The verdict on one sample, with the inputs it was reached from.
struct health_report {
  health_level level = health_level::ok;
  utilization_band band = utilization_band::below;
  double usage = 0.0;                ///< KV usage of the sample
  std::int64_t waiting = 0;          ///< waiting requests of the sample
  std::int64_t swaps_in_window = 0;  ///< swap events (outs and ins) in the window ending at the sample
  std::int64_t waiting_growth = 0;   ///< growth of the waiting queue over that window (negative: it shrank)
  friend bool operator==(const health_report&, const health_report&) = default;
};

/// The health levels over validated thresholds. A default-constructed health_check uses the seed's.
class health_check {
 public:
  health_check() = default;

  /// A check with thresholds `t`; errc::invalid_argument (see validate) for bad ones.
  [[nodiscard]] static result<health_check> create(const health_thresholds& t) noexcept {
    if (status st = validate(t); !st) return st;
    health_check h;
    h.t_ = t;
    return h;
  }

  [[nodiscard]] const health_thresholds& thresholds() const noexcept { return t_; }

  /// The level of a sample with KV usage `usage` (fraction), `waiting` requests, `swaps_in_window` swap events and
  /// a waiting queue that grew by `waiting_growth` over the window, in the seed's order: CRITICAL, WARNING, GOOD, OK.
  [[nodiscard]] health_report check(double usage, std::int64_t waiting, std::int64_t swaps_in_window,
                                    std::int64_t waiting_growth = 0) const noexcept {
    health_report r;
    r.usage = usage;
    r.waiting = waiting;
    r.swaps_in_window = swaps_in_window;
    r.waiting_growth = waiting_growth;
    if (swaps_in_window > t_.critical_swaps || waiting > t_.critical_waiting) {
      r.level = health_level::critical;
    } else if (usage > t_.warning_usage || waiting > t_.warning_waiting || waiting_growth > t_.warning_waiting_growth) {
      r.level = health_level::warning;
    } else if (usage > t_.good_usage) {
      r.level = health_level::good;
    } else {
      r.level = health_level::ok;
    }
    r.band = usage < t_.band_low    ? utilization_band::below
             : usage > t_.band_high ? utilization_band::above
                                    : utilization_band::healthy;
    return r;
  }

  /// The level of the recorder's newest sample, its swaps and the growth of its waiting queue counted over the
  /// window ending there (metrics_recorder::swaps_in_window, waiting_growth_in_window). An empty recorder is OK
  /// with every input 0.
  [[nodiscard]] health_report check(const metrics_recorder& rec) const noexcept {
    if (rec.empty()) return check(0.0, 0, 0);
    const metrics_snapshot& m = rec.newest().metrics;
    return check(m.kv_cache_usage, m.waiting, rec.swaps_in_window(t_.window), rec.waiting_growth_in_window(t_.window));
  }

 private:
  health_thresholds t_{};
};

KVPAGER_NAMESPACE_END
