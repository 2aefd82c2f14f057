// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// kv_event_publisher: KV cache events over ZeroMQ as vLLM's `ZmqEventPublisher` sends them, so a KV-aware router
/// that subscribes to vLLM instances subscribes to kvpager's unchanged. Needs libzmq (Debian: libzmq3-dev) at build
/// and link time: the one monitor header with that dependency; nothing else includes it.
///
/// Wire protocol (vLLM 0.22.0):
/// - A PUB socket at `endpoint`, bound when the endpoint contains `*` or `::` or starts with `ipc://` or
///   `inproc://`, connected otherwise (vLLM's rule; `binds_endpoint`). High-water mark `hwm`.
/// - Each batch is one multipart message (topic, sequence number as 8 bytes big-endian, payload): the topic's bytes
///   (may be empty), the batch counter from 0, and the msgpack `KVEventBatch` (monitor/kv_event_encoding.hpp).
/// - The last `buffer_steps` batches are kept. With a `replay_endpoint`, a ROUTER socket bound there answers a
///   request (client id, empty frame, start sequence as 8 bytes big-endian) with every kept batch whose sequence is
///   at least the start, as (client id, empty, sequence, payload), then (client id, empty, -1 as 8 bytes, empty).
///   Requests of any other shape are ignored, as vLLM does. A background thread serves replay, copying one kept
///   batch at a time under the lock publish() also takes (publish() waits for one copy at most).
///
/// publish() is called from one thread (the engine's step loop). Once the kept batches' buffers have grown,
/// publishing allocates nothing of its own (libzmq copies each frame into its own message).

#include <zmq.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/kv_events.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/monitor/kv_event_encoding.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Options of kv_event_publisher, with vLLM's `KVEventsConfig` defaults.
struct kv_event_publisher_config {
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;  ///< empty: no replay socket
  std::string topic;
  std::int32_t buffer_steps = 10000;  ///< batches kept for replay (>= 1)
  std::int32_t hwm = 100000;          ///< the PUB socket's send high-water mark (>= 0)
  /// Every batch carries it (vLLM's publisher fills its rank in, 0 without data parallelism); a rank r > 0 also
  /// offsets the endpoints as vLLM does: a tcp port by r, an inproc name gets "_dp<r>" (others: invalid_argument).
  std::int32_t data_parallel_rank = 0;
  /// How long closing waits for batches not yet sent (ZMQ_LINGER of the PUB socket). vLLM closes at once (0); a
  /// program that publishes and exits (kvpager-sim) waits, or its last batches may never leave.
  std::int32_t close_linger_ms = 0;
};

namespace detail {

/// `v` as 8 bytes big-endian (a batch's sequence number on the wire).
inline void put_be64(std::uint64_t v, std::uint8_t (&out)[8]) noexcept {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(v >> (8 * (7 - i)));
}
/// The 8 bytes big-endian of `bytes` (at least 8) as a number.
[[nodiscard]] inline std::uint64_t get_be64(std::string_view bytes) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<std::uint8_t>(bytes[i]);
  return v;
}
/// Receives one whole multipart message from `socket` into `frames` (cleared first); stops early if a receive fails.
inline void receive_frames(void* socket, std::vector<std::string>& frames) {
  frames.clear();
  for (;;) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, socket, 0) < 0) {
      zmq_msg_close(&m);
      return;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    const bool more = zmq_msg_more(&m) != 0;
    zmq_msg_close(&m);
    if (!more) return;
  }
}

}  // namespace detail

/// vLLM's rule: whether the PUB socket binds `endpoint` (else it connects).
[[nodiscard]] inline bool binds_endpoint(std::string_view endpoint) noexcept {
  return endpoint.find('*') != std::string_view::npos || endpoint.find("::") != std::string_view::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

/// vLLM's endpoint of data-parallel rank `rank` (offset_endpoint_port): unchanged for rank 0 or an empty endpoint; a
/// tcp endpoint's port (after its last ':') plus rank; an inproc endpoint with "_dp<rank>" appended. false for other
/// transports, or a tcp endpoint whose port is not a number below 65536 - rank.
[[nodiscard]] inline bool offset_endpoint(std::string& endpoint, std::int32_t rank) {
  if (endpoint.empty() || rank == 0) return true;
  if (rank < 0) return false;
  if (endpoint.starts_with("inproc://")) {
    endpoint += "_dp" + std::to_string(rank);
    return true;
  }
  if (!endpoint.starts_with("tcp://")) return false;
  const std::size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 == endpoint.size() || colon < 6) return false;
  long port = 0;
  for (std::size_t i = colon + 1; i < endpoint.size(); ++i) {
    if (endpoint[i] < '0' || endpoint[i] > '9' || port > 65535) return false;
    port = port * 10 + (endpoint[i] - '0');
  }
  if (port + rank > 65535) return false;
  endpoint = endpoint.substr(0, colon + 1) + std::to_string(port + rank);
  return true;
}

class kv_event_publisher {
 public:
  /// Opens the sockets (and starts the replay thread). Errors: errc::invalid_argument (buffer_steps < 1, hwm < 0,
  /// a data-parallel rank that cannot offset the endpoints, an endpoint libzmq refuses or cannot bind or connect:
  /// detail = zmq's errno), errc::device_error (no ZeroMQ context or thread), errc::out_of_memory (the kept
  /// batches' slots); nothing is left open.
  [[nodiscard]] static std::unique_ptr<kv_event_publisher> create(const kv_event_publisher_config& cfg, status& st) {
    st = ok_status();
    if (cfg.buffer_steps < 1) {
      st = status{errc::invalid_argument, "kv_event_publisher: buffer_steps must be at least 1", cfg.buffer_steps};
      return nullptr;
    }
    if (cfg.hwm < 0) {
      st = status{errc::invalid_argument, "kv_event_publisher: hwm must not be negative", cfg.hwm};
      return nullptr;
    }
    std::unique_ptr<kv_event_publisher> p;
#if KVPAGER_HAS_EXCEPTIONS
    try {
#endif
      kv_event_publisher_config c = cfg;
      if (!offset_endpoint(c.endpoint, c.data_parallel_rank) ||
          !offset_endpoint(c.replay_endpoint, c.data_parallel_rank)) {
        st = status{errc::invalid_argument,
                    "kv_event_publisher: a data-parallel rank offsets only tcp and inproc endpoints",
                    c.data_parallel_rank};
        return nullptr;
      }
      p.reset(new kv_event_publisher(c));
#if KVPAGER_HAS_EXCEPTIONS
    } catch (const std::bad_alloc&) {
      st = status{errc::out_of_memory, "kv_event_publisher: no memory for the kept batches", cfg.buffer_steps};
      return nullptr;
    }
#endif
    st = p->open();
    if (!st) return nullptr;
    return p;
  }

  kv_event_publisher(const kv_event_publisher&) = delete;
  kv_event_publisher& operator=(const kv_event_publisher&) = delete;
  ~kv_event_publisher() { close(); }

  /// Sends `buf`'s events as the next batch (time `ts`, seconds since the epoch) and keeps it for replay. Even an
  /// empty buffer is a batch (vLLM's scheduler skips steps without events: so can the caller). Error:
  /// errc::device_error when libzmq refuses the message (detail = errno); the batch is still kept and counted.
  status publish(const kv_event_buffer& buf, double ts) {
    encode_kv_event_batch(buf, ts, payload_, cfg_.data_parallel_rank);  // an int, as vLLM's publisher fills it
    const std::uint64_t seq = next_seq_;  // this thread is its only writer
    std::uint8_t seq_bytes[8];
    detail::put_be64(seq, seq_bytes);
    status st = ok_status();
    if (zmq_send(pub_, cfg_.topic.data(), cfg_.topic.size(), ZMQ_SNDMORE) < 0 ||
        zmq_send(pub_, seq_bytes, 8, ZMQ_SNDMORE) < 0 || zmq_send(pub_, payload_.data(), payload_.size(), 0) < 0)
      st = status{errc::device_error, "kv_event_publisher::publish: zmq_send failed", zmq_errno()};
    {
      std::lock_guard<std::mutex> lock(ring_mutex_);
      ring_[static_cast<std::size_t>(seq % ring_.size())].assign(payload_);  // reuses the slot's capacity
      if (kept_ < ring_.size()) ++kept_;
      next_seq_ = seq + 1;
    }
    events_ += buf.events.size();
    return st;
  }

  /// Batches published so far (the next sequence number).
  [[nodiscard]] std::uint64_t batches() const noexcept { return next_seq_; }  // written by this thread only
  /// Events published so far, over all batches.
  [[nodiscard]] std::uint64_t events() const noexcept { return events_; }
  /// Replay requests answered so far.
  [[nodiscard]] std::uint64_t replays() const noexcept { return replays_.load(); }
  [[nodiscard]] const kv_event_publisher_config& config() const noexcept { return cfg_; }

 private:
  explicit kv_event_publisher(const kv_event_publisher_config& cfg)
      : cfg_(cfg), ring_(static_cast<std::size_t>(cfg.buffer_steps)) {}

  status open() {
    ctx_ = zmq_ctx_new();
    if (ctx_ == nullptr) return status{errc::device_error, "kv_event_publisher: no ZeroMQ context", zmq_errno()};
    pub_ = zmq_socket(ctx_, ZMQ_PUB);
    if (pub_ == nullptr) return fail(status{errc::device_error, "kv_event_publisher: no PUB socket", zmq_errno()});
    const int hwm = cfg_.hwm;
    const int linger = 0;
    const int pub_linger = cfg_.close_linger_ms;
    zmq_setsockopt(pub_, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(pub_, ZMQ_LINGER, &pub_linger, sizeof pub_linger);
    const int rc = binds_endpoint(cfg_.endpoint) ? zmq_bind(pub_, cfg_.endpoint.c_str())
                                                 : zmq_connect(pub_, cfg_.endpoint.c_str());
    if (rc != 0)
      return fail(status{errc::invalid_argument, "kv_event_publisher: the endpoint cannot be bound or connected",
                         zmq_errno()});
    if (!cfg_.replay_endpoint.empty()) {
      router_ = zmq_socket(ctx_, ZMQ_ROUTER);
      if (router_ == nullptr)
        return fail(status{errc::device_error, "kv_event_publisher: no ROUTER socket", zmq_errno()});
      zmq_setsockopt(router_, ZMQ_LINGER, &linger, sizeof linger);
      // A replay can be longer than the high-water mark (10000 batches kept, 1000 queued by default), where a plain
      // ROUTER drops the rest without a word: sends wait for the client instead, a second at a time.
      const int mandatory = 1;
      const int send_timeout_ms = 1000;
      zmq_setsockopt(router_, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof mandatory);
      zmq_setsockopt(router_, ZMQ_SNDTIMEO, &send_timeout_ms, sizeof send_timeout_ms);
      if (zmq_bind(router_, cfg_.replay_endpoint.c_str()) != 0)
        return fail(status{errc::invalid_argument, "kv_event_publisher: the replay endpoint cannot be bound",
                           zmq_errno()});
#if KVPAGER_HAS_EXCEPTIONS
      try {
#endif
        replay_thread_ = std::thread([this] { serve_replay(); });
#if KVPAGER_HAS_EXCEPTIONS
      } catch (...) {
        return fail(status{errc::device_error, "kv_event_publisher: the replay thread cannot be started"});
      }
#endif
    }
    return ok_status();
  }

  status fail(status st) {
    close();
    return st;
  }

  void close() noexcept {
    stop_.store(true);
    if (replay_thread_.joinable()) replay_thread_.join();
    if (router_ != nullptr) zmq_close(router_);
    if (pub_ != nullptr) zmq_close(pub_);
    if (ctx_ != nullptr) zmq_ctx_term(ctx_);
    router_ = pub_ = ctx_ = nullptr;
  }

  /// The replay thread: polls the ROUTER socket (100 ms at a time, so close() is prompt) and answers requests.
  void serve_replay() {
    std::vector<std::string> frames;
    std::string payload;
    while (!stop_.load()) {
      zmq_pollitem_t item{router_, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 100) <= 0 || (item.revents & ZMQ_POLLIN) == 0) continue;
      detail::receive_frames(router_, frames);  // one request: all its frames
      if (frames.size() != 3 || !frames[1].empty() || frames[2].size() != 8) continue;  // not a replay request
      const std::uint64_t start = detail::get_be64(frames[2]);
      // One batch at a time under the lock, so publish() waits for one copy at most; a batch overwritten meanwhile
      // (the ring moved on) is skipped: replay goes on from the oldest still kept, as vLLM's does.
      const std::string& id = frames[0];
      bool sent = true;
      for (std::uint64_t s = start;; ++s) {
        {
          std::lock_guard<std::mutex> lock(ring_mutex_);
          const std::uint64_t next = next_seq_;
          if (s >= next) break;
          if (s < next - kept_) s = next - kept_;  // older than the oldest kept
          payload.assign(ring_[static_cast<std::size_t>(s % ring_.size())]);
        }
        std::uint8_t seq[8];
        detail::put_be64(s, seq);
        if (!(sent = send_to(id, seq, payload))) break;
      }
      const std::uint8_t end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
      if (sent && send_to(id, end, {})) replays_.fetch_add(1);
    }
  }

  /// One replay message (id, empty, seq, payload), waiting while the client's queue is full: false when the client
  /// is gone, stays full for 30 s, or the publisher closes (the rest of that answer is not sent).
  bool send_to(const std::string& id, const std::uint8_t (&seq)[8], std::string_view payload) {
    for (int waited = 0;;) {
      if (zmq_send(router_, id.data(), id.size(), ZMQ_SNDMORE) >= 0) break;
      if (zmq_errno() != EAGAIN || stop_.load() || ++waited >= 30) return false;
    }
    // The identity frame routed it: the rest of the message goes into the same pipe.
    return zmq_send(router_, "", 0, ZMQ_SNDMORE) >= 0 && zmq_send(router_, seq, 8, ZMQ_SNDMORE) >= 0 &&
           zmq_send(router_, payload.data(), payload.size(), 0) >= 0;
  }

  kv_event_publisher_config cfg_;
  void* ctx_ = nullptr;
  void* pub_ = nullptr;
  void* router_ = nullptr;
  std::string payload_;
  std::mutex ring_mutex_;
  std::vector<std::string> ring_;    ///< the last buffer_steps batches' payloads, by sequence modulo the size
  std::size_t kept_ = 0;             ///< batches in ring_ (guarded by ring_mutex_)
  std::uint64_t next_seq_ = 0;       ///< written under ring_mutex_ (the replay thread reads it there)
  std::uint64_t events_ = 0;
  std::atomic<std::uint64_t> replays_{0};
  std::atomic<bool> stop_{false};
  std::thread replay_thread_;
};

KVPAGER_NAMESPACE_END
