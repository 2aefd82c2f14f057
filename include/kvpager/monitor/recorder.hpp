// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// metrics_recorder: a bounded history of timestamped metrics snapshots (the seed's `metrics_history`), kept in a
/// ring allocated once at creation. Recording overwrites the oldest sample when full and allocates nothing, so an
/// engine can record every step. The health check (health.hpp) counts the swaps in a time window from it.
///
/// \code
///   auto rec = *kvpager::metrics_recorder::create(1024);
///   // every step (or every N steps):
///   (void)rec.record(kvpager::take_snapshot(cache, sched, bytes_per_block), now_since_start);
///   const std::int64_t swaps = rec.swaps_in_window(std::chrono::seconds(300));
/// \endcode

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvpager/core/assert.hpp"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/monitor/metrics.hpp"

KVPAGER_NAMESPACE_BEGIN

/// One recorded sample: a snapshot and when it was taken.
struct timed_snapshot {
  /// When, on the caller's clock (any epoch: time since the engine started, a steady_clock reading, ...).
  std::chrono::nanoseconds time{0};
  metrics_snapshot metrics;
  friend bool operator==(const timed_snapshot&, const timed_snapshot&) = default;
};

class metrics_recorder {
 public:
  /// The largest history create accepts.
  static constexpr std::int32_t max_capacity = 1 << 20;

  /// A recorder keeping the last `capacity` samples, all allocated now. errc::invalid_argument for a capacity
  /// outside [1, max_capacity].
  [[nodiscard]] static result<metrics_recorder> create(std::int32_t capacity) {
    if (capacity < 1 || capacity > max_capacity)
      return status{errc::invalid_argument, "metrics_recorder::create: capacity must be in [1, 2^20]", capacity};
    metrics_recorder r;
    r.ring_.resize(static_cast<std::size_t>(capacity));
    return r;
  }

  /// Records `m` taken at `time`; when full, the oldest sample is dropped. errc::invalid_argument (nothing
  /// recorded) if `time` is earlier than the newest sample's: the history is in time order. Allocates nothing.
  [[nodiscard]] status record(const metrics_snapshot& m, std::chrono::nanoseconds time) noexcept {
    if (size_ > 0 && time < newest().time)
      return status{errc::invalid_argument, "metrics_recorder::record: time earlier than the newest sample"};
    std::size_t slot = head_ + size_;
    if (slot >= ring_.size()) slot -= ring_.size();
    ring_[slot].time = time;
    ring_[slot].metrics = m;
    if (size_ < ring_.size()) {
      ++size_;
    } else {
      head_ = head_ + 1 == ring_.size() ? 0 : head_ + 1;
    }
    ++recorded_;
    return ok_status();
  }

  /// Records `m` at std::chrono::steady_clock's now (since its epoch).
  [[nodiscard]] status record(const metrics_snapshot& m) noexcept {
    return record(m, std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now().time_since_epoch()));
  }

  /// Samples held (at most capacity()).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::size_t capacity() const noexcept { return ring_.size(); }
  /// Samples recorded since creation (or clear), including those dropped since.
  [[nodiscard]] std::int64_t recorded() const noexcept { return recorded_; }

  /// Sample `i` of the history, oldest first (0 = oldest, size() - 1 = newest). `i` < size().
  [[nodiscard]] const timed_snapshot& operator[](std::size_t i) const noexcept {
    KVPAGER_ASSERT(i < size_, "metrics_recorder: index past the history");
    std::size_t slot = head_ + i;
    if (slot >= ring_.size()) slot -= ring_.size();
    return ring_[slot];
  }
  /// The newest sample; the recorder must not be empty.
  [[nodiscard]] const timed_snapshot& newest() const noexcept { return (*this)[size_ - 1]; }
  /// The oldest sample held; the recorder must not be empty.
  [[nodiscard]] const timed_snapshot& oldest() const noexcept { return (*this)[0]; }

  /// Forgets every sample (keeps the allocation).
  void clear() noexcept {
    head_ = 0;
    size_ = 0;
    recorded_ = 0;
  }

  /// The sample a window of length `window` ending at the newest sample starts from: the newest sample taken at
  /// or before newest().time - window, or the oldest one held when the history is shorter than the window (then
  /// the window covers only the history). The recorder must not be empty. O(log size()).
  [[nodiscard]] const timed_snapshot& window_start(std::chrono::nanoseconds window) const noexcept {
    // newest().time - window, saturated (a window of nanoseconds::max() is "the whole history").
    const std::int64_t t = newest().time.count();
    const std::int64_t w = window.count();
    std::int64_t e = 0;
    if (w >= 0) {
      e = t < std::numeric_limits<std::int64_t>::min() + w ? std::numeric_limits<std::int64_t>::min() : t - w;
    } else {
      e = t > std::numeric_limits<std::int64_t>::max() + w ? std::numeric_limits<std::int64_t>::max() : t - w;
    }
    const std::chrono::nanoseconds edge{e};
    // The first sample after `edge` (times are non-decreasing), then one back.
    std::size_t lo = 0;
    std::size_t hi = size_;
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if ((*this)[mid].time <= edge) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return (*this)[lo == 0 ? 0 : lo - 1];
  }

  /// How much the counter `field` of metrics_snapshot (e.g. &metrics_snapshot::evictions) grew over the window
  /// ending at the newest sample (window_start to newest). 0 when empty.
  [[nodiscard]] std::int64_t increase(std::int64_t metrics_snapshot::*field,
                                      std::chrono::nanoseconds window) const noexcept {
    if (size_ == 0) return 0;
    return newest().metrics.*field - window_start(window).metrics.*field;
  }

  /// Swap events (outs and ins) in the window ending at the newest sample: what the health check counts.
  [[nodiscard]] std::int64_t swaps_in_window(std::chrono::nanoseconds window) const noexcept {
    if (size_ == 0) return 0;
    return newest().metrics.swap_events() - window_start(window).metrics.swap_events();
  }
  /// How much the waiting queue grew over the window ending at the newest sample: newest().metrics.waiting minus
  /// window_start's (negative when it shrank; 0 when empty). The seed's 3.3.5: a waiting queue that keeps growing
  /// means the pool needs more capacity, whatever its length now.
  [[nodiscard]] std::int64_t waiting_growth_in_window(std::chrono::nanoseconds window) const noexcept {
    if (size_ == 0) return 0;
    return std::int64_t{newest().metrics.waiting} - window_start(window).metrics.waiting;
  }
  /// Preemptions (either mode) in the window ending at the newest sample.
  [[nodiscard]] std::int64_t preemptions_in_window(std::chrono::nanoseconds window) const noexcept {
    if (size_ == 0) return 0;
    return newest().metrics.preemptions() - window_start(window).metrics.preemptions();
  }

 private:
  metrics_recorder() = default;

  std::vector<timed_snapshot> ring_;
  std::size_t head_ = 0;  ///< slot of the oldest sample
  std::size_t size_ = 0;
  std::int64_t recorded_ = 0;
};

KVPAGER_NAMESPACE_END
