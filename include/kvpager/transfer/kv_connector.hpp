// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The two halves of a KV transfer between instances over any kv_transport, in the shape of vLLM's KV connector:
/// kv_sender on the instance that computed a request's KV (a prefill instance) offers it; kv_receiver on the
/// instance that continues the request (a decode instance) takes the offer, reads the bytes straight into the
/// blocks its cache gave the request, and says when it is done, so the sender frees them. Neither half touches a
/// cache or scheduler: the engine passes block tables in and reports results out (docs/disaggregated.md has the
/// sequence of calls on each side, with paged_kv_cache and the scheduler).
///
/// Messages (little-endian, each one transport message): `layout` (its generation, the sender's kv_side, its KV
/// cache groups and its regions' descriptions, once per peer before its first offer, and again after the sender's
/// regions are replaced), `offer` (request id, the generation of the layout it was made under, the tokens, how many
/// have KV, the sender's block tables: one per KV cache group table), `done` (request id, whether it was read). A
/// malformed message is errc::invalid_argument naming the field, and changes nothing, with two exceptions that keep
/// the two sides in step: a malformed offer whose request id could be read is declined (the sender is told, and
/// kv_receiver::refused lists it), and a layout with a new generation that cannot be taken (another model's, a
/// remote key the transport refuses) leaves no layout in force (the old keys no longer match the sender's regions).
/// The generation fields came with 0.3.0: both sides must run the same kvpager version.
///
/// Remote keys that no longer match: a sender that registers its pools again (kv_sender::replace_regions) sends
/// its new layout, with a new generation, before its next offer to each peer. A receiver that has it reads nothing
/// through the old keys: an offer made under the old layout is refused by start() (errc::transport_error), and the
/// engine computes the request itself. Until the new layout arrives a receiver reads through the old keys, so the
/// sender keeps the old registration until every offer made before is done (a transport that can tell, as
/// inproc_transport does, refuses the read: errc::transport_error from start(), the same outcome).
///
/// KV cache groups (hybrid_kv_cache): both halves are created with the same kv_groups (each layer's table and the
/// null block), offers carry every table, and a receiver reads only the entries its own tables hold (a window
/// group's released entries are the null block on either side). The layer-to-table map is part of the model: a
/// sender whose map differs is another model.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"
#include "kvpager/core/types.hpp"
#include "kvpager/transfer/kv_runs.hpp"
#include "kvpager/transfer/transport.hpp"

KVPAGER_NAMESPACE_BEGIN

/// A request's KV a sender offers: its id (the same on both instances), its tokens, how many of them have KV in the
/// sender's blocks, and the sender's block tables for them (one per KV cache group table).
struct kv_offer {
  seq_id id = 0;
  std::uint64_t layout = 0;  ///< the generation of the sender's layout the offer was made under
  std::vector<token_id> tokens;
  std::int64_t computed = 0;
  std::vector<std::vector<block_id>> tables;
};

/// The KV cache groups of one side's pools: the table each layer's blocks are listed in (empty: every layer in one
/// table, a paged_kv_cache), and the entry that holds nothing (hybrid_kv_cache::null_block; no_block: none). A
/// hybrid_kv_cache with units has num_tables() tables: map each layer to its unit_table.
struct kv_groups {
  std::span<const std::int32_t> layer_groups{};
  block_id null_block = no_block;
};

/// A transfer the receiver finished: the request, whether every byte arrived, the bytes, and the time from start()
/// to the end.
struct kv_received {
  seq_id id = 0;
  bool ok = false;
  std::int64_t bytes = 0;
  double seconds = 0;
};

namespace detail {

enum class kv_message : std::uint32_t { layout = 1, offer = 2, done = 3 };

/// Appends fixed-width little-endian fields.
struct message_writer {
  std::vector<std::byte>& out;
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFFU));
  }
  void u64(std::uint64_t v) { put_u64(out, v); }
  void i32(std::int32_t v) { u32(static_cast<std::uint32_t>(v)); }
  void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  void bytes(std::span<const std::byte> b) {
    u32(static_cast<std::uint32_t>(b.size()));
    out.insert(out.end(), b.begin(), b.end());
  }
};

/// Reads fixed-width little-endian fields; the first read past the end sets `bad` (later reads give 0).
struct message_reader {
  std::span<const std::byte> in;
  std::size_t at = 0;
  bool bad = false;
  [[nodiscard]] bool has(std::size_t n) {
    if (bad || in.size() - at < n) bad = true;
    return !bad;
  }
  std::uint32_t u32() {
    if (!has(4)) return 0;
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(in[at + static_cast<std::size_t>(i)]) << (8 * i);
    at += 4;
    return v;
  }
  std::uint64_t u64() {
    if (!has(8)) return 0;
    const std::uint64_t v = get_u64(in, at);
    at += 8;
    return v;
  }
  std::int32_t i32() { return static_cast<std::int32_t>(u32()); }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  /// A count of elements of `size` bytes each, refused (bad) when the rest of the message cannot hold them.
  std::uint32_t count(std::size_t size) {
    const std::uint32_t n = u32();
    if (!bad && (in.size() - at) / size < n) bad = true;
    return bad ? 0 : n;
  }
  std::span<const std::byte> bytes() {
    const std::uint32_t n = count(1);
    if (bad) return {};
    const auto b = in.subspan(at, n);
    at += n;
    return b;
  }
};

inline void write_side(message_writer& w, const kv_side& s) {
  const kv_geometry& g = s.rank.geometry;
  for (const std::int32_t v : {g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim, static_cast<std::int32_t>(g.dtype),
                               s.rank.rank, s.rank.tp, s.rank.kv_head_begin, s.rank.q_head_begin, s.rank.num_q_heads,
                               s.rank.kv_replicas, s.num_layers, static_cast<std::int32_t>(s.layout)})
    w.i32(v);
}

inline kv_side read_side(message_reader& r) {
  kv_side s;
  kv_geometry& g = s.rank.geometry;
  g.num_blocks = r.i32();
  g.block_size = r.i32();
  g.num_kv_heads = r.i32();
  g.head_dim = r.i32();
  const std::int32_t dtype = r.i32();
  s.rank.rank = r.i32();
  s.rank.tp = r.i32();
  s.rank.kv_head_begin = r.i32();
  s.rank.q_head_begin = r.i32();
  s.rank.num_q_heads = r.i32();
  s.rank.kv_replicas = r.i32();
  s.num_layers = r.i32();
  const std::int32_t layout = r.i32();
  if (dtype < 0 || dtype > static_cast<std::int32_t>(kv_dtype::fp8_e4m3) || layout < 0 || layout > 1) r.bad = true;
  g.dtype = static_cast<kv_dtype>(dtype);
  s.layout = static_cast<kv_pool_layout>(layout);
  return s;
}

/// This instance's side of a connector half (kv_sender, kv_receiver): a valid layout, registered as one region per
/// pool region.
template <kv_transport T>
[[nodiscard]] status check_own_side(const T& transport, const kv_side& side, std::span<const mem_handle> regions) {
  if (const status st = check_kv_side(side, "kv connector: this side is not a valid layout"); !st.ok()) return st;
  if (static_cast<std::int32_t>(regions.size()) != side.num_regions())
    return status{errc::invalid_argument, "kv connector: one registered region per pool region",
                  static_cast<std::int64_t>(regions.size())};
  std::vector<std::byte> desc;
  for (const mem_handle m : regions)
    if (const status st = transport.describe(m, desc); !st.ok())
      return st.code() == errc::invalid_argument
                 ? status{errc::invalid_argument, "kv connector: a region that is not registered with the transport", m}
                 : st;
  return status{};
}

[[nodiscard]] inline status malformed(const char* field) noexcept {
  return status{errc::invalid_argument, field};
}

/// A connector half's own KV cache groups, kept: each layer's table (checked against the side) and the null entry.
struct own_groups {
  std::vector<std::int32_t> layer_groups;
  block_id null_block = no_block;
  std::int32_t tables = 1;

  [[nodiscard]] status take(const kv_side& side, const kv_groups& g) {
    if (!g.layer_groups.empty() && static_cast<std::int32_t>(g.layer_groups.size()) != side.num_layers)
      return status{errc::invalid_argument, "kv connector: layer_groups needs one table per layer",
                    static_cast<std::int64_t>(g.layer_groups.size())};
    std::int32_t most = 0;
    for (const std::int32_t t : g.layer_groups) {
      if (t < 0 || t >= 4096) return status{errc::invalid_argument, "kv connector: a layer's table is out of range", t};
      most = t > most ? t : most;
    }
    if (g.null_block < no_block || g.null_block >= side.rank.geometry.num_blocks)
      return status{errc::invalid_argument, "kv connector: the null block is outside the pool", g.null_block};
    layer_groups.assign(g.layer_groups.begin(), g.layer_groups.end());
    null_block = g.null_block;
    tables = most + 1;
    return status{};
  }
  [[nodiscard]] kv_tables view(std::span<const std::span<const block_id>> t) const noexcept {
    return kv_tables{t, layer_groups, null_block};
  }
};

/// A side's KV cache groups in a layout message: the null block, then each layer's table.
inline void write_groups(message_writer& w, const own_groups& g) {
  w.i32(g.null_block);
  w.u32(static_cast<std::uint32_t>(g.layer_groups.size()));
  for (const std::int32_t t : g.layer_groups) w.i32(t);
}

/// False for groups that do not fit `s` (the message is then malformed).
inline bool read_groups(message_reader& r, const kv_side& s, own_groups& g) {
  const block_id null = r.i32();
  const std::uint32_t n = r.count(4);
  std::vector<std::int32_t> layers(r.bad ? 0 : n);
  for (std::int32_t& t : layers) t = r.i32();
  if (r.bad || s.rank.geometry.num_blocks <= 0) return false;
  return g.take(s, kv_groups{layers, null}).ok();
}

}  // namespace detail

/// The sending half: offers requests' KV to receivers and learns when each is done with one.
template <kv_transport T>
class kv_sender {
 public:
  /// Over `transport`, for this instance's pools `side`, registered as `regions` (one per side.num_regions()), with
  /// KV cache groups `groups` (default: one table). errc::invalid_argument for a side that is not a valid layout, a
  /// region count that does not match it, a region not registered with the transport, or groups that do not fit it
  /// (a layer count, a null block outside the pool); the transport's error where describing a region fails.
  static result<kv_sender> create(T& transport, const kv_side& side, std::span<const mem_handle> regions,
                                  kv_groups groups = {}) {
    if (const status st = detail::check_own_side(transport, side, regions); !st.ok()) return st;
    kv_sender s(transport, side);
    if (const status st = s.groups_.take(side, groups); !st.ok()) return st;
    s.regions_.assign(regions.begin(), regions.end());
    return s;
  }

  /// Offers request `id` to peer `p`: `computed` of its `tokens` have KV in the blocks of `tables` (the request's
  /// block tables here, one per table of the groups, each at least ceil(computed / block_size) entries; entries a
  /// window released are the null block). Keep the blocks until poll() says the receiver is done with `id`. The
  /// first offer to a peer sends this side's layout first. Errors: errc::invalid_argument (computed outside [0,
  /// tokens], a table count that does not match the groups, a short table; nothing sent), errc::invalid_block (an
  /// entry outside the pool), the transport's (the layout may have gone out before the offer failed).
  status offer(peer_handle p, seq_id id, std::span<const token_id> tokens, std::int64_t computed,
               std::span<const std::span<const block_id>> tables) {
    const std::int32_t bs = side_.rank.geometry.block_size;
    if (computed < 0 || computed > static_cast<std::int64_t>(tokens.size()))
      return status{errc::invalid_argument, "kv_sender::offer: computed must be in [0, tokens]", computed};
    if (static_cast<std::int32_t>(tables.size()) != groups_.tables)
      return status{errc::invalid_argument, "kv_sender::offer: one table per table of the KV cache groups",
                    static_cast<std::int64_t>(tables.size())};
    const std::int64_t need = (computed + bs - 1) / bs;
    for (const std::span<const block_id> table : tables) {
      if (static_cast<std::int64_t>(table.size()) < need)
        return status{errc::invalid_argument, "kv_sender::offer: a table is shorter than the computed tokens need",
                      static_cast<std::int64_t>(table.size())};
      for (std::int64_t i = 0; i < need; ++i) {
        const block_id b = table[static_cast<std::size_t>(i)];
        if (b != groups_.null_block && (b < 0 || b >= side_.rank.geometry.num_blocks))
          return status{errc::invalid_block, "kv_sender::offer: a table entry outside the pool", b};
      }
    }
    if (!introduced(p)) {
      if (const status st = send_layout(p); !st.ok()) return st;
      introduced_.push_back(p);
    }
    buf_.clear();
    detail::message_writer w{buf_};
    w.u32(static_cast<std::uint32_t>(detail::kv_message::offer));
    w.u64(id);
    w.u64(generation_);
    w.i64(computed);
    w.u32(static_cast<std::uint32_t>(tokens.size()));
    for (const token_id t : tokens) w.i32(t);
    w.u32(static_cast<std::uint32_t>(tables.size()));
    for (const std::span<const block_id> table : tables) {
      w.u32(static_cast<std::uint32_t>(need));
      for (std::int64_t i = 0; i < need; ++i) w.i32(table[static_cast<std::size_t>(i)]);
    }
    return transport_->send(p, buf_);
  }
  /// One table (a paged_kv_cache).
  status offer(peer_handle p, seq_id id, std::span<const token_id> tokens, std::int64_t computed,
               std::span<const block_id> table) {
    const std::span<const block_id> one[1] = {table};
    return offer(p, id, tokens, computed, one);
  }

  /// This side's pools registered again as `regions` (new remote keys: the pools moved, or were registered anew):
  /// the next offer to each peer first sends the new layout, with a new generation, and a receiver that has it
  /// refuses the offers made before (their keys no longer match). Keep the old regions registered until poll() has
  /// reported every offer made before this call (a receiver may still be reading them through the old keys).
  /// errc::invalid_argument (nothing changed) for a region count that does not match the side or a region that is
  /// not registered.
  status replace_regions(std::span<const mem_handle> regions) {
    if (const status st = detail::check_own_side(*transport_, side_, regions); !st.ok()) return st;
    regions_.assign(regions.begin(), regions.end());
    ++generation_;
    introduced_.clear();
    return ok_status();
  }
  /// The generation of this side's layout: a value no other kv_sender of this process starts with, one more at
  /// each replace_regions.
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }

  /// The requests peer `p` is done with since the last call (appended to `done`; read or not: free their blocks
  /// either way). errc::transport_error once the peer is gone (every offer to it is then done: the engine frees
  /// them); errc::invalid_argument for a malformed message (skipped).
  status poll(peer_handle p, std::vector<seq_id>& done) {
    for (;;) {
      const result<bool> r = transport_->receive(p, msg_);
      if (!r.ok()) return r.error();
      if (!*r) return ok_status();
      detail::message_reader m{msg_};
      const auto kind = static_cast<detail::kv_message>(m.u32());
      const seq_id id = m.u64();
      (void)m.u32();  // read or not: the blocks are free either way
      if (m.bad || kind != detail::kv_message::done) return detail::malformed("kv_sender::poll: not a done message");
      done.push_back(id);
    }
  }

  [[nodiscard]] const kv_side& side() const noexcept { return side_; }

 private:
  kv_sender(T& t, const kv_side& s) : transport_(&t), side_(s) {}
  /// Distinct for every kv_sender of this process, and unlikely to repeat across processes (the clock): a sender
  /// created again on the same connection is a new layout to the receiver, never the same one.
  static std::uint64_t first_generation() noexcept {
    static std::atomic<std::uint64_t> made{0};
    const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    return ((now << 12) ^ (made.fetch_add(1, std::memory_order_relaxed) << 1)) | 1U;
  }
  [[nodiscard]] bool introduced(peer_handle p) const noexcept {
    for (const peer_handle q : introduced_)
      if (q == p) return true;
    return false;
  }
  status send_layout(peer_handle p) {
    buf_.clear();
    detail::message_writer w{buf_};
    w.u32(static_cast<std::uint32_t>(detail::kv_message::layout));
    w.u64(generation_);
    detail::write_side(w, side_);
    detail::write_groups(w, groups_);
    w.u32(static_cast<std::uint32_t>(regions_.size()));
    std::vector<std::byte> desc;
    for (const mem_handle m : regions_) {
      if (const status st = transport_->describe(m, desc); !st.ok()) return st;
      w.bytes(desc);
    }
    return transport_->send(p, buf_);
  }

  T* transport_;
  kv_side side_;
  detail::own_groups groups_;
  std::vector<mem_handle> regions_;
  std::uint64_t generation_ = first_generation();
  std::vector<peer_handle> introduced_;
  std::vector<std::byte> buf_, msg_;
};

/// The receiving half: takes a sender's offers, reads their KV into this instance's blocks, and tells the sender
/// when it is done with each.
template <kv_transport T>
class kv_receiver {
 public:
  /// Over `transport`, connected to sender `peer`, for this instance's pools `side` registered as `regions`; a read
  /// not finished within `timeout` fails (the connection to the sender is then closed, which ends every read in
  /// flight from it: their blocks are safe to free). `groups`: this side's KV cache groups, as the sender's (the
  /// same model groups its layers the same way). Errors as kv_sender::create.
  static result<kv_receiver> create(T& transport, peer_handle peer, const kv_side& side,
                                    std::span<const mem_handle> regions, std::chrono::milliseconds timeout,
                                    kv_groups groups = {}) {
    if (const status st = detail::check_own_side(transport, side, regions); !st.ok()) return st;
    kv_receiver r(transport, peer, side, timeout);
    if (const status st = r.groups_.take(side, groups); !st.ok()) return st;
    r.regions_.assign(regions.begin(), regions.end());
    return r;
  }

  /// The sender's new offers (appended to `offers`). The sender's layout, when it arrives, is checked against this
  /// side: a different model (head size, element type, layers, KV heads) is errc::invalid_argument, and every offer
  /// is then declined (done, not read; refused() lists them). A new layout of the same sender (its regions
  /// registered again) replaces the remote keys: offers made before it are refused by start(), reads in flight go
  /// on with the keys they started with. Errors: errc::transport_error once the sender is gone (and only then);
  /// errc::invalid_argument for a malformed message (skipped; the message named in the error; a malformed offer
  /// whose id could be read is declined), another model's layout, or a layout whose remote keys the transport
  /// refuses (its offers are then declined).
  status poll(std::vector<kv_offer>& offers) {
    for (;;) {
      const result<bool> r = transport_->receive(peer_, msg_);
      if (!r.ok()) return r.error();
      if (!*r) return ok_status();
      detail::message_reader m{msg_};
      const auto kind = static_cast<detail::kv_message>(m.u32());
      if (kind == detail::kv_message::layout) {
        if (const status st = take_layout(m); !st.ok()) return st;
        continue;
      }
      if (kind != detail::kv_message::offer) return detail::malformed("kv_receiver::poll: an unknown message kind");
      kv_offer o;
      o.id = m.u64();
      const bool id_read = !m.bad;
      o.layout = m.u64();
      o.computed = m.i64();
      const std::uint32_t nt = m.count(4);
      o.tokens.resize(nt);
      for (token_id& t : o.tokens) t = m.i32();
      const std::uint32_t ntab = m.count(4);
      o.tables.resize(m.bad ? 0 : ntab);
      for (std::vector<block_id>& table : o.tables) {
        const std::uint32_t nb = m.count(4);
        table.resize(m.bad ? 0 : nb);
        for (block_id& b : table) b = m.i32();
      }
      const char* bad = m.bad || o.computed < 0 || o.computed > static_cast<std::int64_t>(nt)
                            ? "kv_receiver::poll: a malformed offer (lengths or computed count)"
                        : layout_ok_ && static_cast<std::int32_t>(ntab) != sender_groups_.tables
                            ? "kv_receiver::poll: an offer's table count differs from the sender's groups"
                            : nullptr;
      if (bad != nullptr) {
        if (id_read) {  // declined, so that the sender does not hold its blocks for an offer never read
          refused_.push_back(o.id);
          (void)send_done(o.id, false);
        }
        return detail::malformed(bad);
      }
      if (!layout_ok_ || o.layout != generation_) {  // no layout, another model's, or not the one in force
        refused_.push_back(o.id);
        if (const status st = send_done(o.id, false); !st.ok()) return st;
        continue;
      }
      offers_.push_back(o);
      offers.push_back(std::move(o));
    }
  }

  /// Starts reading offer `id`'s tokens [first_token, first_token + num_tokens) into this side's blocks `tables`
  /// (the request's block tables here, one per table of the groups; cache.external_blocks(id) says which tokens its
  /// cache waits for; entries that are this side's null block receive nothing). Errors (nothing started):
  /// errc::unknown_sequence (no open offer `id`), errc::invalid_argument (tokens the offer does not hold, tables
  /// that do not fit: plan_kv_runs's errors, among them a token this side keeps that the sender released), the
  /// transport's (errc::transport_error also for an offer made under a layout the sender has replaced since: its
  /// remote keys no longer match). The offer stays open after an error: decline it.
  status start(seq_id id, std::span<const std::span<const block_id>> tables, std::int64_t first_token,
               std::int64_t num_tokens) {
    kv_offer* o = find(id);
    if (o == nullptr) return status{errc::unknown_sequence, "kv_receiver::start: no open offer for this request", static_cast<std::int64_t>(id)};
    if (!layout_ok_ || o->layout != generation_)
      return status{errc::transport_error,
                    "kv_receiver::start: the offer was made under a layout the sender has replaced (its remote keys "
                    "no longer match)",
                    static_cast<std::int64_t>(id)};
    if (first_token < 0 || num_tokens < 0 || first_token + num_tokens > o->computed)
      return status{errc::invalid_argument, "kv_receiver::start: tokens the offer has no KV for",
                    first_token + num_tokens};
    src_tables_.clear();
    for (const std::vector<block_id>& t : o->tables) src_tables_.emplace_back(t);
    runs_.clear();
    if (const status st = plan_kv_runs(sender_, sender_groups_.view(src_tables_), side_, groups_.view(tables),
                                       first_token, num_tokens, runs_);
        !st.ok())
      return st;
    const result<transfer_handle> x = transport_->read(peer_, runs_, remotes_, regions_);
    if (!x.ok()) return x.error();
    flights_.push_back(flight{id, *x, run_bytes(runs_), std::chrono::steady_clock::now(), keys_epoch_});
    erase_offer(id);
    return ok_status();
  }
  /// One table (a paged_kv_cache).
  status start(seq_id id, std::span<const block_id> table, std::int64_t first_token, std::int64_t num_tokens) {
    const std::span<const block_id> one[1] = {table};
    return start(id, one, first_token, num_tokens);
  }

  /// Declines offer `id` (the request will not be read: rejected, cancelled, or computed here): the sender is told.
  /// errc::unknown_sequence for no open offer.
  status decline(seq_id id) {
    if (find(id) == nullptr) return status{errc::unknown_sequence, "kv_receiver::decline: no open offer", static_cast<std::int64_t>(id)};
    erase_offer(id);
    return send_done(id, false);
  }

  /// Reads that ended (appended to `ended`), each reported to the sender. A read past its timeout closes the
  /// connection (every read from the sender then fails).
  status progress(std::vector<kv_received>& ended) {
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < flights_.size();) {
      flight& f = flights_[i];
      const result<transfer_state> s = transport_->poll(f.x);
      transfer_state st = s.ok() ? *s : transfer_state::failed;
      // Closed once, also when the peer is already gone: a read from a peer that closed its end may never end
      // otherwise (UCX over TCP: nothing answers its gets), and closing ends it.
      if (st == transfer_state::in_flight && now - f.started > timeout_ && !closed_) {
        (void)transport_->disconnect(peer_);  // ends the reads in flight; they are reported failed as they end
        closed_ = true;
        ++timeouts_;
      }
      if (st == transfer_state::in_flight) {
        ++i;
        continue;
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - f.started).count();
      ended.push_back(kv_received{f.id, st == transfer_state::done, f.bytes, secs});
      if (transport_->peer_alive(peer_)) (void)send_done(f.id, st == transfer_state::done);
      flights_.erase(flights_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    release_retired();
    return ok_status();
  }

  /// The offers this receiver declined on its own since the last call (appended to `ids`): offers that came with no
  /// layout, another model's, under a layout not in force, or malformed. The sender has been told; the engine
  /// computes these requests itself (it never saw them as offers). Call it after each poll(): the list grows until
  /// it is taken.
  void refused(std::vector<seq_id>& ids) {
    ids.insert(ids.end(), refused_.begin(), refused_.end());
    refused_.clear();
  }

  /// Reads started and not ended, and offers received and not started or declined.
  [[nodiscard]] std::size_t in_flight() const noexcept { return flights_.size(); }
  [[nodiscard]] std::size_t open_offers() const noexcept { return offers_.size(); }
  /// Reads that ran past the timeout.
  [[nodiscard]] std::int64_t timeouts() const noexcept { return timeouts_; }
  /// Whether the sender's layout arrived and describes the same model as this side.
  [[nodiscard]] bool layout_ok() const noexcept { return layout_ok_; }

 private:
  struct flight {
    seq_id id = 0;
    transfer_handle x = 0;
    std::int64_t bytes = 0;
    std::chrono::steady_clock::time_point started;
    std::uint64_t keys = 0;  ///< the keys_epoch_ of the remote keys the read uses
  };
  /// Remote keys of a layout that was replaced, kept while reads through them are in flight.
  struct retired_keys {
    std::uint64_t keys = 0;  ///< their keys_epoch_
    std::vector<remote_handle> remotes;
  };

  kv_receiver(T& t, peer_handle p, const kv_side& s, std::chrono::milliseconds timeout)
      : transport_(&t), peer_(p), side_(s), timeout_(timeout) {}

  status take_layout(detail::message_reader& m) {
    const std::uint64_t generation = m.u64();
    const kv_side s = detail::read_side(m);
    detail::own_groups g;
    const bool groups_read = detail::read_groups(m, s, g);
    const std::uint32_t n = m.count(4);
    std::vector<std::span<const std::byte>> descs;
    for (std::uint32_t i = 0; i < n && !m.bad; ++i) descs.push_back(m.bytes());
    if (m.bad || !groups_read) return detail::malformed("kv_receiver::poll: a malformed layout message");
    if (generation == 0) return detail::malformed("kv_receiver::poll: a layout of generation 0");
    if (generation == generation_)
      return status{errc::invalid_argument, "kv_receiver: the sender's layout again, with the same generation",
                    static_cast<std::int64_t>(generation)};
    // From here on the layout in force is this one, or none: the old keys no longer match the sender's regions.
    retire_keys();
    generation_ = generation;
    layout_ok_ = false;
    if (const status st = detail::check_kv_side(s, "kv_receiver: the sender's layout is not valid"); !st.ok()) return st;
    if (static_cast<std::int32_t>(n) != s.num_regions())
      return status{errc::invalid_argument, "kv_receiver: the sender's layout has the wrong number of regions", n};
    if (s.rank.geometry.head_dim != side_.rank.geometry.head_dim || s.rank.geometry.dtype != side_.rank.geometry.dtype ||
        s.num_layers != side_.num_layers || s.model_kv_heads() != side_.model_kv_heads() ||
        g.layer_groups != groups_.layer_groups)
      return status{errc::invalid_argument, "kv_receiver: the sender serves another model (head size, KV element type, "
                                            "layers, KV heads or KV cache groups)"};
    std::vector<remote_handle> remotes;
    for (const std::span<const std::byte> d : descs) {
      const result<remote_handle> r = transport_->import_remote(peer_, d);
      if (!r.ok()) {
        for (const remote_handle x : remotes) (void)transport_->release_remote(x);
        // transport_error from poll() means the sender is gone: a key refused from a live sender is not that.
        if (!transport_->peer_alive(peer_)) return r.error();
        return status{errc::invalid_argument, "kv_receiver: the sender's layout holds a remote key the transport refuses",
                      static_cast<std::int64_t>(generation)};
      }
      remotes.push_back(*r);
    }
    remotes_ = std::move(remotes);
    sender_ = s;
    sender_groups_ = std::move(g);
    layout_ok_ = true;
    return ok_status();
  }
  /// The keys in force stop being used for new reads: released now, or once the reads through them have ended.
  void retire_keys() {
    if (!remotes_.empty()) retired_.push_back(retired_keys{keys_epoch_, std::move(remotes_)});
    remotes_.clear();
    ++keys_epoch_;
    release_retired();
  }
  void release_retired() {
    for (std::size_t i = 0; i < retired_.size();) {
      bool used = false;
      for (const flight& f : flights_) used = used || f.keys == retired_[i].keys;
      if (used) {
        ++i;
        continue;
      }
      for (const remote_handle x : retired_[i].remotes) (void)transport_->release_remote(x);
      retired_.erase(retired_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  status send_done(seq_id id, bool read) {
    buf_.clear();
    detail::message_writer w{buf_};
    w.u32(static_cast<std::uint32_t>(detail::kv_message::done));
    w.u64(id);
    w.u32(read ? 1U : 0U);
    return transport_->send(peer_, buf_);
  }
  kv_offer* find(seq_id id) noexcept {
    for (kv_offer& o : offers_)
      if (o.id == id) return &o;
    return nullptr;
  }
  void erase_offer(seq_id id) {
    for (std::size_t i = 0; i < offers_.size(); ++i)
      if (offers_[i].id == id) {
        offers_.erase(offers_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
  }

  T* transport_;
  peer_handle peer_;
  kv_side side_;
  std::chrono::milliseconds timeout_;
  detail::own_groups groups_;
  kv_side sender_{};
  detail::own_groups sender_groups_;
  bool layout_ok_ = false;
  std::uint64_t generation_ = 0;  ///< the generation of the sender's last layout (0: none yet)
  std::uint64_t keys_epoch_ = 0;  ///< counts the sets of remote keys this receiver has had in force
  std::vector<mem_handle> regions_;
  std::vector<remote_handle> remotes_;  ///< the keys of the layout in force
  std::vector<retired_keys> retired_;
  std::vector<seq_id> refused_;
  std::vector<kv_offer> offers_;
  std::vector<flight> flights_;
  std::vector<kv_run> runs_;
  std::vector<std::span<const block_id>> src_tables_;
  std::vector<std::byte> buf_, msg_;
  std::int64_t timeouts_ = 0;
  bool closed_ = false;  ///< this side closed the connection (a read past the timeout)
};

KVPAGER_NAMESPACE_END
