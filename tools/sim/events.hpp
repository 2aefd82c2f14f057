// SPDX-License-Identifier: Apache-2.0
#pragma once
// --kv-events: the paged run's KV cache events (kvpager/core/kv_events.hpp), taken from the cache once per step and
// published in vLLM's wire format (kvpager/monitor/kv_event_publisher.hpp, over ZeroMQ), with what was published
// counted for the JSON (`kv_events`: batches, events, the blocks stored and not removed at the end per medium).

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <kvpager/core/kv_events.hpp>
#if KVPAGER_SIM_HAS_ZMQ
#include <kvpager/monitor/kv_event_publisher.hpp>
#endif

namespace kvsim {

struct kv_event_sink {
  kvpager::kv_event_buffer buffer;  ///< the cache reports into it (set_kv_event_buffer)
#if KVPAGER_SIM_HAS_ZMQ
  std::unique_ptr<kvpager::kv_event_publisher> publisher;
#endif
  std::int64_t batches = 0;
  std::int64_t events = 0;
  std::int64_t send_errors = 0;
  std::array<std::int64_t, 2> stored{};  ///< per medium (device, host): stored and not removed, from the events
  std::FILE* check = nullptr;            ///< hidden test hook: after each batch, the cache's own cached blocks

  /// Publishes the step's events as one batch (steps without events publish nothing, as vLLM's scheduler does) and
  /// clears the buffer. `cache_state` (for the check file) gives the cache's cached blocks: count and hash sum.
  template <class CacheState>
  void flush(CacheState&& cache_state) {
    if (buffer.empty()) return;
    for (const kvpager::kv_event& e : buffer.events) {
      const auto m = static_cast<std::size_t>(e.medium);
      switch (e.type) {
        case kvpager::kv_event_type::block_stored: stored[m] += e.num_hashes; break;
        case kvpager::kv_event_type::block_removed: stored[m] -= e.num_hashes; break;
        case kvpager::kv_event_type::all_blocks_cleared: stored = {}; break;
      }
    }
#if KVPAGER_SIM_HAS_ZMQ
    if (publisher) {
      const double ts =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      if (!publisher->publish(buffer, ts)) ++send_errors;
    }
#endif
    if (check != nullptr) {
      const auto [count, sum] = cache_state();
      std::fprintf(check, "%lld %lld %llu\n", static_cast<long long>(batches), static_cast<long long>(count),
                   static_cast<unsigned long long>(sum));
    }
    ++batches;
    events += static_cast<std::int64_t>(buffer.events.size());
    buffer.clear();
  }
};

}  // namespace kvsim
