// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// inproc_transport: the kv_transport of one process. Two transport objects are connected with
/// inproc_transport::connect; a read is a memcpy of each run from the peer's registered region, finished when it is
/// started (its first poll says done). For tests, and for an engine whose prefill and decode caches live in one
/// process. Faults can be injected (set_read_fault, disconnect) to test what an engine does when a transfer fails or
/// never ends, without a network.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/span_of.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/transfer/transport.hpp"

KVPAGER_NAMESPACE_BEGIN

class inproc_transport {
 public:
  /// What reads started from now on do (a test's fault).
  enum class read_fault : std::uint8_t {
    none,  ///< copy and finish
    fail,  ///< copy nothing; the first poll says failed
    hang,  ///< copy nothing; every poll says in_flight (the engine's timeout must end it)
  };

  inproc_transport() : self_(std::make_shared<state>()) {}

  /// Connects `a` and `b` (two different objects): a's handle for b, and b's handle for a.
  static std::pair<peer_handle, peer_handle> connect(inproc_transport& a, inproc_transport& b) {
    auto l = std::make_shared<link>();
    const auto pa = static_cast<peer_handle>(a.peers_.size());
    const auto pb = static_cast<peer_handle>(b.peers_.size());
    a.peers_.push_back(peer{l, 0, b.self_});
    b.peers_.push_back(peer{l, 1, a.self_});
    return {pa, pb};
  }

  /// Ends the connection to `p` on both sides, as a peer that dies: later operations naming it fail, reads in flight
  /// from it fail. errc::transport_error for an unknown peer.
  status disconnect(peer_handle p) {
    if (!known(p)) return no_peer(p);
    peers_[static_cast<std::size_t>(p)].l->alive = false;
    return status{};
  }

  void set_read_fault(read_fault f) noexcept { fault_ = f; }

  result<mem_handle> register_memory(void* p, std::size_t n) {
    if (p == nullptr || n == 0)
      return status{errc::invalid_argument, "inproc_transport::register_memory: a null or empty region",
                    static_cast<std::int64_t>(n)};
    self_->regions.push_back(detail::transfer_region{reinterpret_cast<std::uintptr_t>(p), n, true});
    return static_cast<mem_handle>(self_->regions.size() - 1);
  }
  status deregister_memory(mem_handle m) {
    if (!local_live(m))
      return status{errc::invalid_argument, "inproc_transport::deregister_memory: not a registered region", m};
    self_->regions[static_cast<std::size_t>(m)].live = false;
    return status{};
  }
  /// Region m's description: its index, base and length (16 + 8 bytes, little-endian).
  status describe(mem_handle m, std::vector<std::byte>& out) const {
    if (!local_live(m)) return status{errc::invalid_argument, "inproc_transport::describe: not a registered region", m};
    const detail::transfer_region& r = self_->regions[static_cast<std::size_t>(m)];
    out.clear();
    detail::put_u64(out, static_cast<std::uint64_t>(m));
    detail::put_u64(out, r.base);
    detail::put_u64(out, r.bytes);
    return status{};
  }
  /// The peer's region that `bytes` describes. errc::transport_error for a peer that is not connected or a
  /// description that matches no live region of that peer (deregistered since, or another peer's).
  result<remote_handle> import_remote(peer_handle p, std::span<const std::byte> bytes) {
    if (!alive(p)) return no_peer(p);
    if (bytes.size() != 24)
      return status{errc::transport_error, "inproc_transport::import_remote: not a region description",
                    static_cast<std::int64_t>(bytes.size())};
    const std::uint64_t index = detail::get_u64(bytes, 0);
    const std::uint64_t base = detail::get_u64(bytes, 8);
    const std::uint64_t len = detail::get_u64(bytes, 16);
    const std::shared_ptr<state> other = peers_[static_cast<std::size_t>(p)].other.lock();
    if (!other || index >= other->regions.size() || !other->regions[index].live || other->regions[index].base != base ||
        other->regions[index].bytes != len)
      return status{errc::transport_error,
                    "inproc_transport::import_remote: the description matches no region of the peer",
                    static_cast<std::int64_t>(index)};
    remotes_.push_back(remote{p, static_cast<mem_handle>(index), true});
    return static_cast<remote_handle>(remotes_.size() - 1);
  }
  status release_remote(remote_handle r) {
    if (r < 0 || static_cast<std::size_t>(r) >= remotes_.size() || !remotes_[static_cast<std::size_t>(r)].live)
      return status{errc::invalid_argument, "inproc_transport::release_remote: not an imported region", r};
    remotes_[static_cast<std::size_t>(r)].live = false;
    return status{};
  }

  /// Copies every run now (unless a fault is set). Errors, nothing copied: errc::transport_error for a peer that is
  /// gone or whose region was deregistered since it was imported; errc::invalid_argument for a run outside its
  /// regions, or a region imported from another peer.
  result<transfer_handle> read(peer_handle p, std::span<const kv_run> runs, std::span<const remote_handle> src,
                               std::span<const mem_handle> dst) {
    if (!alive(p)) return no_peer(p);
    const std::shared_ptr<state> other = peers_[static_cast<std::size_t>(p)].other.lock();
    if (!other) return no_peer(p);
    for (const remote_handle r : src) {
      if (r < 0 || static_cast<std::size_t>(r) >= remotes_.size() || !remotes_[static_cast<std::size_t>(r)].live ||
          remotes_[static_cast<std::size_t>(r)].from != p)
        return status{errc::invalid_argument, "inproc_transport::read: a source region not imported from this peer", r};
      const mem_handle m = remotes_[static_cast<std::size_t>(r)].index;
      if (!other->regions[static_cast<std::size_t>(m)].live)
        return status{errc::transport_error, "inproc_transport::read: the peer deregistered a source region", r};
    }
    const auto remote_len = [&](remote_handle r) {
      return static_cast<std::int64_t>(other->regions[static_cast<std::size_t>(remotes_[static_cast<std::size_t>(r)].index)].bytes);
    };
    if (const status st = detail::check_runs(runs, src, dst, detail::span_of(self_->regions), remote_len); !st.ok())
      return st;
    transfer_state s = transfer_state::done;
    if (fault_ == read_fault::none) {
      for (const kv_run& run : runs) {
        const auto& from = other->regions[static_cast<std::size_t>(remotes_[static_cast<std::size_t>(src[static_cast<std::size_t>(run.src_region)])].index)];
        const auto& to = self_->regions[static_cast<std::size_t>(dst[static_cast<std::size_t>(run.dst_region)])];
        if (run.bytes > 0)
          std::memmove(reinterpret_cast<void*>(to.base + static_cast<std::uintptr_t>(run.dst_offset)),
                       reinterpret_cast<const void*>(from.base + static_cast<std::uintptr_t>(run.src_offset)),
                       static_cast<std::size_t>(run.bytes));
      }
    } else {
      s = fault_ == read_fault::fail ? transfer_state::failed : transfer_state::in_flight;
    }
    flights_.push_back(flight{next_++, p, s});
    return flights_.back().id;
  }
  /// The read's state; done or failed ends the handle. A read in flight from a peer that went away fails.
  result<transfer_state> poll(transfer_handle x) {
    for (std::size_t i = 0; i < flights_.size(); ++i) {
      if (flights_[i].id != x) continue;
      transfer_state s = flights_[i].s;
      if (s == transfer_state::in_flight && !alive(flights_[i].from)) s = transfer_state::failed;
      if (s != transfer_state::in_flight) flights_.erase(flights_.begin() + static_cast<std::ptrdiff_t>(i));
      return s;
    }
    return status{errc::invalid_argument, "inproc_transport::poll: not a transfer in flight", x};
  }
  status send(peer_handle p, std::span<const std::byte> bytes) {
    if (!alive(p)) return no_peer(p);
    const peer& q = peers_[static_cast<std::size_t>(p)];
    q.l->inbox[1 - q.side].emplace_back(bytes.begin(), bytes.end());
    return status{};
  }
  /// Messages sent before a disconnect are still received; then errc::transport_error.
  result<bool> receive(peer_handle p, std::vector<std::byte>& out) {
    if (!known(p)) return no_peer(p);
    const peer& q = peers_[static_cast<std::size_t>(p)];
    auto& box = q.l->inbox[q.side];
    if (box.empty()) {
      if (!q.l->alive) return no_peer(p);
      return false;
    }
    out = std::move(box.front());
    box.pop_front();
    return true;
  }
  [[nodiscard]] bool peer_alive(peer_handle p) const noexcept { return alive(p); }

  /// Reads started and not yet ended by a poll.
  [[nodiscard]] std::size_t reads_in_flight() const noexcept { return flights_.size(); }

 private:
  struct state {
    std::vector<detail::transfer_region> regions;
  };
  struct link {
    std::deque<std::vector<std::byte>> inbox[2];
    bool alive = true;
  };
  struct peer {
    std::shared_ptr<link> l;
    int side = 0;
    std::weak_ptr<state> other;
  };
  struct remote {
    peer_handle from = -1;
    mem_handle index = -1;
    bool live = false;
  };
  struct flight {
    transfer_handle id = 0;
    peer_handle from = -1;
    transfer_state s = transfer_state::in_flight;
  };

  [[nodiscard]] bool known(peer_handle p) const noexcept { return p >= 0 && static_cast<std::size_t>(p) < peers_.size(); }
  [[nodiscard]] bool alive(peer_handle p) const noexcept {
    return known(p) && peers_[static_cast<std::size_t>(p)].l->alive && !peers_[static_cast<std::size_t>(p)].other.expired();
  }
  [[nodiscard]] bool local_live(mem_handle m) const noexcept {
    return m >= 0 && static_cast<std::size_t>(m) < self_->regions.size() && self_->regions[static_cast<std::size_t>(m)].live;
  }
  static status no_peer(peer_handle p) noexcept {
    return status{errc::transport_error, "inproc_transport: the peer is not connected (gone, or never was)", p};
  }

  std::shared_ptr<state> self_;
  std::vector<peer> peers_;
  std::vector<remote> remotes_;
  std::vector<flight> flights_;
  transfer_handle next_ = 1;
  read_fault fault_ = read_fault::none;
};
static_assert(kv_transport<inproc_transport>);

KVPAGER_NAMESPACE_END
