// SPDX-License-Identifier: Apache-2.0
#pragma once
// kvpager-generate's disaggregated roles (docs/disaggregated.md): a prefill instance computes each request's prompt
// and offers its KV; one or more decode instances read it over UCX into their own blocks (kvpager::kv_receiver)
// and generate. This file is the glue an engine copies: the connection set-up, and the calls around each step.
//
//   prefill: listen, accept each decode instance; per request: add_request, hold; when it finishes, offer it to its
//            decode instance (request index modulo the decode instances); every step: poll done -> release.
//   decode:  connect; every step: poll offers -> add_request with external tokens; progress -> complete_external;
//            after schedule(): start a read for each request the step lists in step_output::external.

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <kvpager/transfer/kv_connector.hpp>
#include <kvpager/transfer/ucx_transport.hpp>

namespace kvgen {

enum class kv_role : std::uint8_t { single, prefill, decode };

struct disagg_options {
  kv_role role = kv_role::single;
  std::string host;        ///< --kv-listen (prefill) or --kv-connect (decode) address
  std::uint16_t port = 0;
  std::int32_t peers = 1;  ///< decode instances (the requests are split among them by index)
  std::int32_t index = 0;  ///< this decode instance's share: requests r with r % peers == index
  std::chrono::milliseconds timeout{30000};  ///< a read, a connection, a silent peer
};

/// What the transfers measured (decode side), and what the prefill side offered and got back.
struct disagg_stats {
  std::int64_t offered = 0, released = 0;               // prefill
  std::int64_t received = 0, failed = 0, bytes = 0;     // decode
  std::int64_t recomputed_locally = 0;                  // decode: requests never offered (gone), or offers refused
  std::int64_t refused_messages = 0;                    // decode: another model's layout, malformed messages
  double transfer_s = 0;                                // decode: sum over reads
  std::vector<std::pair<std::int32_t, double>> per_request;  // decode: (request index, read seconds)
};

/// One instance's link to the others: the UCX transport, its pools registered, and the sender or the receiver.
class disagg_link {
 public:
  /// Sets up the role: registers `pools` (one per layer), then listens and accepts `o.peers` decode instances
  /// (prefill) or connects, retrying until o.timeout (decode). "" or what failed.
  /// `groups`: the cache's KV cache groups (each layer's table and the null block; default one table).
  std::string open(const disagg_options& o, const kvpager::kv_side& side, const std::vector<std::span<std::byte>>& pools,
                   kvpager::kv_groups groups = {}) {
    o_ = o;
    auto t = kvpager::ucx_transport::create(kvpager::ucx_options{o.timeout, o.timeout, true});
    if (!t) return std::string("UCX: ") + t.error().message();
    transport_.emplace(std::move(*t));
    std::vector<kvpager::mem_handle> mems;
    for (const std::span<std::byte> p : pools) {
      const auto m = transport_->register_memory(p.data(), p.size());
      if (!m) return std::string("UCX: registering a KV pool: ") + m.error().message();
      mems.push_back(*m);
    }
    const auto until = std::chrono::steady_clock::now() + o.timeout;
    if (o.role == kv_role::prefill) {
      const auto port = transport_->listen(o.host, o.port);
      if (!port) return "--kv-listen " + o.host + ":" + std::to_string(o.port) + ": " + port.error().message();
      // Each decode instance says its --kv-peer-index first: request r goes to the instance of index r % peers.
      peers_.assign(static_cast<std::size_t>(o.peers), -1);
      for (std::int32_t k = 0; k < o.peers; ++k) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        const auto p = transport_->accept(std::max(left, std::chrono::milliseconds{1}));
        if (!p) return "--kv-listen: decode instance " + std::to_string(k + 1) + " of " + std::to_string(o.peers) +
                       " did not connect: " + p.error().message();
        std::vector<std::byte> hello;
        bool got = false;
        while (!got && std::chrono::steady_clock::now() < until) {
          const auto r = transport_->receive(*p, hello);
          if (!r) break;
          got = *r;
        }
        const std::int32_t index = got && hello.size() == 1 ? static_cast<std::int32_t>(hello[0]) : -1;
        if (index < 0 || index >= o.peers || peers_[static_cast<std::size_t>(index)] >= 0)
          return "--kv-listen: a decode instance did not give a free --kv-peer-index below --kv-peers " +
                 std::to_string(o.peers);
        peers_[static_cast<std::size_t>(index)] = *p;
      }
      auto s = kvpager::kv_sender<kvpager::ucx_transport>::create(*transport_, side, mems, groups);
      if (!s) return std::string("kv_sender: ") + s.error().message();
      sender_.emplace(std::move(*s));
      return "";
    }
    for (;;) {
      const auto p = transport_->connect(o.host, o.port);
      if (p) {
        peers_.push_back(*p);
        const std::byte index[1] = {static_cast<std::byte>(o.index)};
        if (const kvpager::status st = transport_->send(*p, index); !st)
          return "--kv-connect: " + std::string(st.message());
        break;
      }
      if (std::chrono::steady_clock::now() >= until || p.error().code() == kvpager::errc::invalid_argument)
        return "--kv-connect " + o.host + ":" + std::to_string(o.port) + ": " + p.error().message();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    auto r = kvpager::kv_receiver<kvpager::ucx_transport>::create(*transport_, peers_[0], side, mems, o.timeout, groups);
    if (!r) return std::string("kv_receiver: ") + r.error().message();
    receiver_.emplace(std::move(*r));
    return "";
  }

  [[nodiscard]] const disagg_options& options() const noexcept { return o_; }
  [[nodiscard]] disagg_stats& stats() noexcept { return st_; }
  [[nodiscard]] bool ours(std::size_t request) const noexcept {
    return o_.role != kv_role::decode || static_cast<std::int32_t>(request % static_cast<std::size_t>(o_.peers)) == o_.index;
  }

  // ---- prefill side
  /// Offers request `request`'s KV (its prompt, every token computed, `tables` the held sequence's block tables);
  /// `sent` says whether the offer went out. A decode instance that is gone, before the send or during it (the send
  /// fails with transport_error, or times out and closes the connection), is no error: nothing is offered, and the
  /// caller frees the sequence instead of holding it.
  std::string offer(std::size_t request, std::span<const kvpager::token_id> prompt,
                    std::span<const std::span<const kvpager::block_id>> tables, bool& sent) {
    sent = false;
    const kvpager::peer_handle p = peers_[request % peers_.size()];
    if (!transport_->peer_alive(p)) return "";
    if (const kvpager::status st = sender_->offer(p, request, prompt, static_cast<std::int64_t>(prompt.size()), tables); !st) {
      if (st.code() == kvpager::errc::transport_error || !transport_->peer_alive(p)) return "";
      return std::string("kv_sender::offer: ") + st.message();
    }
    ++st_.offered;
    sent = true;
    return "";
  }
  /// Requests the decode instances are done with (read or not), and whether any of them is gone (then everything
  /// offered to it is done).
  void poll_done(std::vector<kvpager::seq_id>& done, std::vector<std::size_t>& gone_peers) {
    for (std::size_t k = 0; k < peers_.size(); ++k) {
      const kvpager::status st = sender_->poll(peers_[k], done);
      if (!st && st.code() == kvpager::errc::transport_error) gone_peers.push_back(k);
    }
  }
  [[nodiscard]] std::size_t peer_of(std::size_t request) const noexcept { return request % peers_.size(); }

  // ---- decode side
  /// New offers, and the requests whose offers the receiver declined itself (`refused`: another model's layout, an
  /// offer under a layout not in force; computed here); `gone` set once the prefill instance is gone.
  std::string poll_offers(std::vector<kvpager::kv_offer>& offers, std::vector<kvpager::seq_id>& refused, bool& gone) {
    const kvpager::status st = receiver_->poll(offers);
    receiver_->refused(refused);
    if (!st && st.code() == kvpager::errc::transport_error) {
      gone = true;
      return "";
    }
    if (!st) {  // another model's layout, a malformed message: its offers are declined, computed here
      ++st_.refused_messages;
      if (st_.refused_messages == 1) std::fprintf(stderr, "kvpager-generate: kv_receiver: %s\n", st.message());
    }
    return "";
  }
  std::string start(kvpager::seq_id request, std::span<const std::span<const kvpager::block_id>> tables,
                    std::int64_t first, std::int64_t n) {
    if (const kvpager::status st = receiver_->start(request, tables, first, n); !st)
      return std::string("kv_receiver::start: ") + st.message();
    return "";
  }
  void progress(std::vector<kvpager::kv_received>& ended) {
    (void)receiver_->progress(ended);
    for (const kvpager::kv_received& r : ended) {
      if (r.ok) {
        ++st_.received;
        st_.bytes += r.bytes;
        st_.transfer_s += r.seconds;
        st_.per_request.emplace_back(static_cast<std::int32_t>(r.id), r.seconds);
      } else {
        ++st_.failed;
      }
    }
  }
  void decline(kvpager::seq_id request) { (void)receiver_->decline(request); }
  [[nodiscard]] std::size_t reads_in_flight() const noexcept { return receiver_ ? receiver_->in_flight() : 0; }

 private:
  disagg_options o_;
  std::optional<kvpager::ucx_transport> transport_;
  std::optional<kvpager::kv_sender<kvpager::ucx_transport>> sender_;
  std::optional<kvpager::kv_receiver<kvpager::ucx_transport>> receiver_;
  std::vector<kvpager::peer_handle> peers_;
  disagg_stats st_;
};

}  // namespace kvgen
