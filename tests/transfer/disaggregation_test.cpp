// SPDX-License-Identifier: Apache-2.0
// Disaggregated prefill and decode over kv_sender / kv_receiver and inproc_transport, each instance a scheduler over
// vllm_v1_cache with emulated KV (every token's K/V a function of its layer, token id and position, written through
// the step's slot mapping): the decode instance admits a request with external tokens, reads its KV from the
// prefill instance's held blocks into the blocks its cache gave it (other block size), runs it as a prefix hit and
// computes only the tail; its pools then hold exactly what computing every token itself would have written. Faults:
// a failed read, a read that never ends (timeout), a sender that goes away, a receiver out of blocks, another
// model's layout, remote keys that no longer match (the sender registered its pools again): every request ends,
// recomputed or read, and no block is left held on either side.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "kvpager/serving.hpp"
#include "kvpager/transfer/inproc_transport.hpp"
#include "kvpager/transfer/kv_connector.hpp"
#include "transfer_support.hpp"

namespace kvpager {
namespace {

using namespace std::chrono_literals;
using cache_t = vllm_v1_cache;
using sched_t = scheduler<cache_t>;

constexpr std::int32_t layers = 2;
constexpr std::int32_t kv_heads = 2;
constexpr std::int32_t head_dim = 4;

/// K/V element d of (layer, token at position pos, kv, head).
std::uint32_t content(std::int32_t layer, token_id tok, std::int64_t pos, std::int32_t kv, std::int32_t head, std::int32_t d) {
  return static_cast<std::uint32_t>(test::kv_value(layer, pos * 100003 + tok, kv, head, d));
}

/// One instance: a cache, its scheduler, per-layer pools in host memory, the request's tokens so far. With KV cache
/// groups (hybrid_kv_cache): layer 0 in a full-attention group (table 0), layer 1 in a sliding window (table 1).
template <class Cache>
struct basic_instance {
  static constexpr bool grouped = requires(const Cache& c) { c.num_groups(); };
  static constexpr std::int32_t window = 40;  // tokens of the sliding-window group
  explicit basic_instance(Cache c) : cache(std::move(c)) {}
  Cache cache;
  std::unique_ptr<scheduler<Cache>> sched;
  kv_side side;
  std::vector<std::vector<std::byte>> pools;
  inproc_transport transport;
  std::vector<mem_handle> mems;
  std::map<seq_id, std::vector<token_id>> tokens;
  std::map<seq_id, std::int32_t> max_new, prompt_len;
  std::map<seq_id, std::vector<std::int32_t>> starts;  // the start of each chunk scheduled
  std::vector<seq_id> finished;

  static std::unique_ptr<basic_instance> make(std::int32_t block_size, std::int32_t blocks, std::int64_t budget = 8192) {
    auto c = [&] {
      if constexpr (grouped) {
        const any_group_kind kinds[2] = {full_attention{}, sliding_window{window}};
        return Cache::create(cache_config{block_size, blocks, 1, 0}, kinds, {hybrid_conventions::vllm});
      } else {
        return Cache::create(cache_config{block_size, blocks, 0, 0});
      }
    }();
    EXPECT_TRUE(c.ok());
    auto in = std::make_unique<basic_instance>(std::move(*c));
    scheduler_config cfg = scheduler_config::vllm_v1();
    cfg.max_num_batched_tokens = budget;
    cfg.chunked_prefill = true;
    auto s = scheduler<Cache>::create(in->cache, cfg);
    EXPECT_TRUE(s.ok());
    in->sched = std::make_unique<scheduler<Cache>>(std::move(*s));
    const kv_geometry g{blocks, block_size, kv_heads, head_dim, kv_dtype::f32};
    in->side = kv_side{*rank_layout(g, kv_heads * 2, 1, 0), layers, kv_pool_layout::per_layer};
    for (std::int32_t l = 0; l < layers; ++l) in->pools.emplace_back(static_cast<std::size_t>(in->side.region_bytes()), std::byte{0});
    for (auto& p : in->pools) in->mems.push_back(*in->transport.register_memory(p.data(), p.size()));
    return in;
  }

  void add(seq_id id, const std::vector<token_id>& prompt, std::int32_t new_tokens, std::int32_t external = 0) {
    tokens[id] = prompt;
    max_new[id] = new_tokens;
    prompt_len[id] = static_cast<std::int32_t>(prompt.size());
    const result<admission> a = sched->add_request(id, prompt, sequence_options{.external_tokens = external});
    ASSERT_TRUE(a.ok()) << a.error().message();
  }

  /// Each layer's table (layer l in table l with groups, else every layer in table 0), and the connector's groups.
  static constexpr std::int32_t layer_tables[layers] = {0, grouped ? 1 : 0};
  static kv_groups groups() {
    if constexpr (grouped) return kv_groups{layer_tables, Cache::null_block};
    return kv_groups{};
  }
  /// Sequence `id`'s block tables, one per table.
  std::vector<std::span<const block_id>> tables(seq_id id) const {
    std::vector<std::span<const block_id>> t;
    EXPECT_TRUE(cache.block_tables(id, t).ok());
    return t;
  }

  /// Token `pos` of request `id` written at `slots[l]` in layer l.
  void write(std::span<const std::int64_t> slots, seq_id id, std::int64_t pos) {
    const std::int32_t bs = side.rank.geometry.block_size;
    const token_id tok = tokens[id][static_cast<std::size_t>(pos)];
    for (std::int32_t l = 0; l < layers; ++l) {
      const std::int64_t slot = slots[static_cast<std::size_t>(l)];
      for (std::int32_t kv = 0; kv < 2; ++kv)
        for (std::int32_t h = 0; h < kv_heads; ++h)
          for (std::int32_t d = 0; d < head_dim; ++d) {
            const std::uint32_t v = content(l, tok, pos, kv, h, d);
            std::memcpy(pools[static_cast<std::size_t>(l)].data() +
                            side.offset(l, static_cast<block_id>(slot / bs), kv, h, static_cast<std::int32_t>(slot % bs)) +
                            d * 4,
                        &v, 4);
          }
    }
  }

  /// One step: schedule, write the step's K/V, sample (a function of the request and its length), complete.
  const step_output& step() {
    const step_output& out = sched->schedule();
    EXPECT_TRUE(out.error.ok()) << out.error.message();
    std::size_t k = 0;
    const std::size_t n = out.slot_mapping.size() / (grouped ? 2 : 1);  // slots per table
    for (const scheduled_sequence& e : out.scheduled) {
      starts[e.id].push_back(e.start);
      for (std::int32_t p = e.start; p < e.start + e.num_tokens; ++p, ++k) {
        std::int64_t slots[layers];
        for (std::int32_t l = 0; l < layers; ++l)
          slots[l] = out.slot_mapping[static_cast<std::size_t>(layer_tables[l]) * n + k];
        write(slots, e.id, p);
      }
    }
    for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
      const scheduled_sequence e = out.scheduled[i];
      if (!e.last_chunk) continue;
      std::vector<token_id>& t = tokens[e.id];
      const token_id next = static_cast<token_id>((t.size() * 7919 + static_cast<std::size_t>(e.id) * 31) % 997);
      t.push_back(next);
      const bool done = static_cast<std::int32_t>(t.size()) - prompt_len[e.id] >= max_new[e.id];
      EXPECT_TRUE(sched->complete_scheduled(i, next, done).ok());
      if (done) finished.push_back(e.id);
    }
    for (const finished_request& f : out.finished) finished.push_back(f.id);
    return out;
  }

  /// Sequence `id`'s pools hold every computed token's K/V as computing it here writes it (in the blocks its
  /// tables still hold: a window's released entries are the null block).
  [[nodiscard]] bool holds(seq_id id, std::int64_t num_tokens) {
    if (!cache.contains(id)) return false;
    const std::vector<std::span<const block_id>> t = tables(id);
    const std::int32_t bs = side.rank.geometry.block_size;
    for (std::int64_t p = 0; p < num_tokens; ++p)
      for (std::int32_t l = 0; l < layers; ++l) {
        const block_id b = t[static_cast<std::size_t>(layer_tables[l])][static_cast<std::size_t>(p / bs)];
        if (grouped && b == 0) continue;
        for (std::int32_t kv = 0; kv < 2; ++kv)
          for (std::int32_t h = 0; h < kv_heads; ++h)
            for (std::int32_t d = 0; d < head_dim; ++d) {
              std::uint32_t v = 0;
              std::memcpy(&v, pools[static_cast<std::size_t>(l)].data() +
                                  side.offset(l, b, kv, h, static_cast<std::int32_t>(p % bs)) + d * 4,
                          4);
              if (v != content(l, tokens[id][static_cast<std::size_t>(p)], p, kv, h, d)) return false;
            }
      }
    return true;
  }

  [[nodiscard]] bool idle_and_empty() const {
    const std::int64_t usable = cache.config().num_blocks - cache.config().reserved_blocks;
    if (cache.num_sequences() != 0 || cache.available_blocks() != usable)
      std::printf("instance: %d sequences, %lld of %lld blocks available\n", cache.num_sequences(),
                  static_cast<long long>(cache.available_blocks()), static_cast<long long>(usable));
    return cache.num_sequences() == 0 && cache.available_blocks() == usable;
  }
};
using instance = basic_instance<cache_t>;

std::vector<token_id> prompt(std::int32_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<token_id> p(static_cast<std::size_t>(n));
  for (token_id& t : p) t = static_cast<token_id>(rng() % 997);
  return p;
}

/// The prefill side runs request `id` to its first token with its blocks held, then offers it.
template <class Cache>
void prefill_and_offer(basic_instance<Cache>& P, kv_sender<inproc_transport>& sender, peer_handle to, seq_id id,
                       const std::vector<token_id>& p) {
  P.add(id, p, 1);
  ASSERT_TRUE(P.sched->hold(id).ok());
  for (int i = 0; i < 50 && std::find(P.finished.begin(), P.finished.end(), id) == P.finished.end(); ++i) P.step();
  ASSERT_NE(std::find(P.sched->held().begin(), P.sched->held().end(), id), P.sched->held().end());
  ASSERT_TRUE(P.cache.contains(id));
  ASSERT_TRUE(P.holds(id, static_cast<std::int64_t>(p.size())));
  const std::vector<std::span<const block_id>> tables = P.tables(id);
  const status st = sender.offer(to, id, p, static_cast<std::int64_t>(p.size()), tables);
  ASSERT_TRUE(st.ok()) << st.message();
}

template <class Cache>
struct basic_pair {
  using instance = basic_instance<Cache>;
  std::unique_ptr<instance> P, D;
  peer_handle to_d = -1, to_p = -1;
  std::unique_ptr<kv_sender<inproc_transport>> sender;
  std::unique_ptr<kv_receiver<inproc_transport>> receiver;

  std::int64_t start_failures = 0;  // reads the receiver could not plan (the request is computed here)

  basic_pair(std::int32_t p_bs, std::int32_t d_bs, std::int32_t d_blocks, std::chrono::milliseconds timeout = 5000ms,
             std::int64_t d_budget = 8192, std::int64_t p_budget = 8192) {
    P = instance::make(p_bs, 256, p_budget);
    D = instance::make(d_bs, d_blocks, d_budget);
    std::tie(to_d, to_p) = inproc_transport::connect(P->transport, D->transport);
    sender = std::make_unique<kv_sender<inproc_transport>>(
        *kv_sender<inproc_transport>::create(P->transport, P->side, P->mems, instance::groups()));
    receiver = std::make_unique<kv_receiver<inproc_transport>>(
        *kv_receiver<inproc_transport>::create(D->transport, to_p, D->side, D->mems, timeout, instance::groups()));
  }

  /// The decode side's loop for one step: take offers (admit them with external tokens), start the reads the
  /// scheduler asks for, report the ended ones, run the step; the prefill side releases what the receiver is done with.
  std::vector<kv_received> round(std::int32_t new_tokens) {
    std::vector<kv_offer> offers;
    const status ps = receiver->poll(offers);
    EXPECT_TRUE(ps.ok() || (ps.code() == errc::transport_error && !D->transport.peer_alive(to_p))) << ps.message();
    for (const kv_offer& o : offers) D->add(o.id, o.tokens, new_tokens, static_cast<std::int32_t>(o.computed));
    std::vector<kv_received> ended;
    EXPECT_TRUE(receiver->progress(ended).ok());
    for (const kv_received& r : ended) EXPECT_TRUE(D->cache.complete_external(r.id, r.ok).ok());
    const step_output& out = D->step();
    for (const seq_id id : out.external) {
      const result<external_range> x = D->cache.external_blocks(id);
      EXPECT_TRUE(x.ok());
      const std::int32_t bs = D->side.rank.geometry.block_size;
      const std::vector<std::span<const block_id>> tables = D->tables(id);
      const status st = receiver->start(id, tables, std::int64_t{x->first} * bs, std::int64_t{x->count} * bs);
      if (!st.ok()) {  // as an engine does: decline it and compute the request here
        // invalid_argument: a plan that does not fit; transport_error: remote keys that no longer match.
        EXPECT_TRUE(st.code() == errc::invalid_argument || st.code() == errc::transport_error) << st.message();
        ++start_failures;
        EXPECT_TRUE(receiver->decline(id).ok());
        EXPECT_TRUE(D->cache.complete_external(id, false).ok());
      }
    }
    std::vector<seq_id> done;
    (void)sender->poll(to_d, done);
    for (const seq_id id : done) {
      const status rs = P->sched->release(id);
      EXPECT_TRUE(rs.ok()) << "release " << id << ": " << rs.message();
    }
    return ended;
  }
};
using pair_fixture = basic_pair<cache_t>;

TEST(Disaggregation, TheDecodeSideReadsThePromptsKvAndComputesOnlyTheTail) {
  for (const auto& [p_bs, d_bs] : {std::pair{16, 32}, std::pair{32, 16}, std::pair{16, 16}, std::pair{8, 64}}) {
    pair_fixture f(p_bs, d_bs, 128);
    const std::vector<token_id> p = prompt(150, 1);
    prefill_and_offer(*f.P, *f.sender, f.to_d, 1, p);
    std::vector<kv_received> got;
    for (int i = 0; i < 40 && std::find(f.D->finished.begin(), f.D->finished.end(), 1) == f.D->finished.end(); ++i) {
      const auto e = f.round(6);
      got.insert(got.end(), e.begin(), e.end());
      if (f.D->cache.contains(1) && std::find(f.D->finished.begin(), f.D->finished.end(), 1) == f.D->finished.end()) {
        EXPECT_TRUE(f.D->holds(1, *f.D->cache.num_tokens(1)) || f.D->cache.load_state(1).value() == tier_load_state::loading);
      }
    }
    ASSERT_EQ(got.size(), 1U) << "block sizes " << p_bs << " -> " << d_bs;
    EXPECT_TRUE(got[0].ok);
    const std::int32_t ext = 149 / d_bs * d_bs;  // full blocks below the last prompt token
    EXPECT_EQ(got[0].bytes, std::int64_t{ext} * layers * 2 * kv_heads * head_dim * 4);
    // The decode side computed only the tail: its first chunk starts after the external tokens.
    ASSERT_FALSE(f.D->starts[1].empty());
    EXPECT_EQ(f.D->starts[1].front(), ext);
    EXPECT_EQ(f.D->tokens[1].size(), 156U);
    EXPECT_EQ(f.D->sched->stats().external_waits, 1);
    // The prefill side released its held request: both sides hold nothing.
    EXPECT_TRUE(f.P->sched->held().empty());
    EXPECT_TRUE(f.P->idle_and_empty());
    EXPECT_TRUE(f.D->idle_and_empty());
    // The received blocks are in the decode side's prefix cache: the same prompt again is a device hit.
    f.D->add(2, p, 2);
    f.D->step();
    EXPECT_EQ(f.D->starts[2].front(), ext);
  }
}

TEST(Disaggregation, ATinyBudgetChunksOnlyTheTailAfterTheExternalTokens) {
  // 5 tokens a step on the decode side: the 150-token prompt's 144 external tokens cost no budget; its tail (6
  // tokens) takes two chunks, the first starting right after them.
  pair_fixture f(16, 16, 128, 5000ms, 5);
  prefill_and_offer(*f.P, *f.sender, f.to_d, 1, prompt(150, 2));
  for (int i = 0; i < 60 && f.D->finished.empty(); ++i) {
    f.round(3);
    if (f.D->cache.contains(1) && *f.D->cache.load_state(1) == tier_load_state::none) {
      EXPECT_TRUE(f.D->holds(1, *f.D->cache.num_tokens(1)));
    }
  }
  ASSERT_EQ(f.D->finished.size(), 1U);
  ASSERT_GE(f.D->starts[1].size(), 2U);
  EXPECT_EQ(f.D->starts[1][0], 144);
  EXPECT_EQ(f.D->starts[1][1], 149);
  EXPECT_TRUE(f.P->idle_and_empty());
  EXPECT_TRUE(f.D->idle_and_empty());
}

TEST(Disaggregation, ContentMatchesAComputeOfEveryTokenAcrossManyRequests) {
  pair_fixture f(16, 32, 256);
  std::vector<seq_id> ids;
  for (seq_id id = 1; id <= 12; ++id) {
    const std::vector<token_id> p = prompt(20 + static_cast<std::int32_t>(id) * 17, 100 + static_cast<std::uint64_t>(id));
    prefill_and_offer(*f.P, *f.sender, f.to_d, id, p);
    ids.push_back(id);
  }
  std::map<seq_id, bool> checked;
  for (int i = 0; i < 200 && f.D->finished.size() < ids.size(); ++i) {
    f.round(4);
    for (const seq_id id : ids)
      if (f.D->cache.contains(id) && f.D->cache.load_state(id).value() == tier_load_state::none) {
        EXPECT_TRUE(f.D->holds(id, *f.D->cache.num_tokens(id))) << "request " << id;
        checked[id] = true;
      }
  }
  EXPECT_EQ(f.D->finished.size(), ids.size());
  EXPECT_EQ(checked.size(), ids.size());
  EXPECT_TRUE(f.P->idle_and_empty());
  EXPECT_TRUE(f.D->idle_and_empty());
}

TEST(Disaggregation, AFailedOrHungReadIsComputedLocallyAndNothingLeaks) {
  for (const auto fault : {inproc_transport::read_fault::fail, inproc_transport::read_fault::hang}) {
    pair_fixture f(16, 16, 128, 50ms);
    const std::vector<token_id> p = prompt(100, 9);
    prefill_and_offer(*f.P, *f.sender, f.to_d, 1, p);
    f.D->transport.set_read_fault(fault);
    std::vector<kv_received> got;
    bool checked = false;
    for (int i = 0; i < 400 && f.D->finished.empty(); ++i) {
      const auto e = f.round(3);
      got.insert(got.end(), e.begin(), e.end());
      if (f.D->cache.contains(1) && *f.D->cache.load_state(1) == tier_load_state::none) {
        EXPECT_TRUE(f.D->holds(1, *f.D->cache.num_tokens(1))) << "computed here, the pools hold what computing writes";
        checked = true;
      }
      if (fault == inproc_transport::read_fault::hang) std::this_thread::sleep_for(1ms);
    }
    EXPECT_TRUE(checked);
    ASSERT_EQ(got.size(), 1U);
    EXPECT_FALSE(got[0].ok);
    ASSERT_EQ(f.D->finished.size(), 1U) << "the request ends: computed here";
    EXPECT_EQ(f.D->sched->stats().external_failures, 1);
    EXPECT_EQ(f.D->starts[1].back() == 0 || f.D->starts[1].size() > 1, true);
    EXPECT_TRUE(f.D->idle_and_empty());
    if (fault == inproc_transport::read_fault::hang) {
      EXPECT_EQ(f.receiver->timeouts(), 1);
      // The connection was closed: the prefill side finds the peer gone and frees what it held for it.
      std::vector<seq_id> done;
      EXPECT_EQ(f.sender->poll(f.to_d, done).code(), errc::transport_error);
      ASSERT_TRUE(f.P->sched->release(1).ok());
    } else {
      // A failed read is reported: the sender released it.
      EXPECT_TRUE(f.P->sched->held().empty());
    }
    EXPECT_TRUE(f.P->idle_and_empty());
  }
}

/// inproc_transport whose reads do not end on their own, even once the peer is gone, until this side closes the
/// connection: a UCX read from a peer that closed its end (nothing answers its gets).
struct unanswered_reads : inproc_transport {
  bool closed = false;
  result<transfer_state> poll(transfer_handle x) {
    if (!closed) return transfer_state::in_flight;
    return inproc_transport::poll(x);
  }
  status disconnect(peer_handle p) {
    closed = true;
    return inproc_transport::disconnect(p);
  }
};
static_assert(kv_transport<unanswered_reads>);

TEST(Disaggregation, AReadFromASenderThatClosedItsEndEndsAtTheTimeout) {
  // The receiver closes the connection at its timeout even when the peer is already gone: that ends the read.
  const kv_geometry g{8, 16, kv_heads, head_dim, kv_dtype::f32};
  const kv_side side{*rank_layout(g, kv_heads * 2, 1, 0), 1, kv_pool_layout::per_layer};
  std::vector<std::byte> sp(static_cast<std::size_t>(side.region_bytes())), dp(sp.size());
  inproc_transport P;
  unanswered_reads D;
  D.set_read_fault(inproc_transport::read_fault::hang);
  const auto [to_d, to_p] = inproc_transport::connect(P, D);
  const mem_handle pm[1] = {*P.register_memory(sp.data(), sp.size())};
  const mem_handle dm[1] = {*D.register_memory(dp.data(), dp.size())};
  result<kv_sender<inproc_transport>> sender = kv_sender<inproc_transport>::create(P, side, pm);
  result<kv_receiver<unanswered_reads>> receiver = kv_receiver<unanswered_reads>::create(D, to_p, side, dm, 50ms);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  const std::vector<token_id> p = prompt(40, 3);
  const block_id src[3] = {1, 2, 3}, dst[3] = {4, 5, 6};
  ASSERT_TRUE(sender->offer(to_d, 1, p, 32, std::span<const block_id>(src)).ok());
  std::vector<kv_offer> offers;
  ASSERT_TRUE(receiver->poll(offers).ok());
  ASSERT_EQ(offers.size(), 1U);
  ASSERT_TRUE(receiver->start(1, std::span<const block_id>(dst), 0, 32).ok());
  ASSERT_TRUE(P.disconnect(to_d).ok());  // the sender closes its end with the read in flight
  EXPECT_FALSE(D.peer_alive(to_p));
  std::vector<kv_received> ended;
  for (const auto until = std::chrono::steady_clock::now() + 5s;
       ended.empty() && std::chrono::steady_clock::now() < until;) {
    EXPECT_TRUE(receiver->progress(ended).ok());
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(ended.size(), 1U) << "the read ends when the receiver closes the connection at its timeout";
  EXPECT_FALSE(ended[0].ok);
  EXPECT_TRUE(D.closed);
  EXPECT_EQ(receiver->timeouts(), 1);
  EXPECT_EQ(receiver->in_flight(), 0U);
}

TEST(Disaggregation, AReceiverOutOfBlocksWaitsThenReads) {
  // 12 usable blocks of 16 tokens: two 100-token requests (7 blocks each) do not fit together.
  pair_fixture f(16, 16, 13);
  prefill_and_offer(*f.P, *f.sender, f.to_d, 1, prompt(100, 1));
  prefill_and_offer(*f.P, *f.sender, f.to_d, 2, prompt(100, 2));
  for (int i = 0; i < 200 && f.D->finished.size() < 2; ++i) f.round(2);
  EXPECT_EQ(f.D->finished.size(), 2U);
  EXPECT_EQ(f.D->sched->stats().external_waits, 2);
  EXPECT_TRUE(f.P->idle_and_empty());
  EXPECT_TRUE(f.D->idle_and_empty());
}

TEST(Disaggregation, AnotherModelsLayoutIsRefusedAndItsOffersDeclined) {
  pair_fixture f(16, 16, 64);
  kv_side other = f.P->side;
  other.rank.geometry.head_dim = 8;  // another model
  other.rank.geometry.num_blocks = 64;
  std::vector<std::vector<std::byte>> pools(layers, std::vector<std::byte>(static_cast<std::size_t>(other.region_bytes())));
  std::vector<mem_handle> mems;
  for (auto& p : pools) mems.push_back(*f.P->transport.register_memory(p.data(), p.size()));
  auto s = kv_sender<inproc_transport>::create(f.P->transport, other, mems);
  ASSERT_TRUE(s.ok());
  const std::vector<token_id> p = prompt(40, 3);
  const std::vector<block_id> table{1, 2, 3};
  ASSERT_TRUE(s->offer(f.to_d, 7, p, 40, table).ok());
  std::vector<kv_offer> offers;
  EXPECT_EQ(f.receiver->poll(offers).code(), errc::invalid_argument);
  EXPECT_FALSE(f.receiver->layout_ok());
  EXPECT_TRUE(f.receiver->poll(offers).ok());
  EXPECT_TRUE(offers.empty()) << "the offer is declined, not taken";
  std::vector<seq_id> refused;
  f.receiver->refused(refused);
  EXPECT_EQ(refused, std::vector<seq_id>{7}) << "the engine learns which requests to compute itself";
  refused.clear();
  f.receiver->refused(refused);
  EXPECT_TRUE(refused.empty());
  std::vector<seq_id> done;
  ASSERT_TRUE(s->poll(f.to_d, done).ok());
  EXPECT_EQ(done, std::vector<seq_id>{7});
  // Bad offers are refused before anything is sent.
  EXPECT_EQ(s->offer(f.to_d, 8, p, 41, table).code(), errc::invalid_argument);
  EXPECT_EQ(s->offer(f.to_d, 8, p, 40, std::vector<block_id>{1, 2}).code(), errc::invalid_argument);
  EXPECT_EQ(s->offer(f.to_d, 8, p, 40, std::vector<block_id>{1, 2, 99}).code(), errc::invalid_block);
  // A truncated message is an error that names it.
  const std::byte junk[6] = {std::byte{2}, std::byte{0}, std::byte{0}, std::byte{0}, std::byte{1}, std::byte{2}};
  ASSERT_TRUE(f.P->transport.send(f.to_d, junk).ok());
  const status st = f.receiver->poll(offers);
  EXPECT_EQ(st.code(), errc::invalid_argument);
  EXPECT_NE(std::string(st.message()).find("offer"), std::string::npos);
  // Starting an offer that does not exist changes nothing.
  EXPECT_EQ(f.receiver->start(99, table, 0, 16).code(), errc::unknown_sequence);
  EXPECT_EQ(f.receiver->in_flight(), 0U);
}

/// The prefill instance registers its pools again (new remote keys) and tells its sender; `drop_old`: the old
/// registration goes at once (against kv_sender::replace_regions's advice: reads through it may still come).
template <class Inst, class Sender>
void register_again(Inst& P, Sender& sender, bool drop_old) {
  std::vector<mem_handle> fresh;
  for (auto& pool : P.pools) fresh.push_back(*P.transport.register_memory(pool.data(), pool.size()));
  const std::uint64_t before = sender.generation();
  ASSERT_TRUE(sender.replace_regions(fresh).ok());
  EXPECT_NE(sender.generation(), before);
  if (drop_old) {
    for (const mem_handle m : P.mems) ASSERT_TRUE(P.transport.deregister_memory(m).ok());
  }
  P.mems = fresh;
}

TEST(Disaggregation, AnOfferWhoseRemoteKeysNoLongerMatchIsNeverReadAndIsComputedHere) {
  // Request 1 is offered, then the prefill instance registers its pools again. (a) Its new layout reaches the
  // receiver first (it comes with the offer of request 2): request 1's offer is refused by start(), without a read
  // (the old registration is still there, as replace_regions asks: only the generation tells). (b) No new layout
  // yet, and the old registration gone: the read through the old keys is refused by the transport. Either way
  // request 1 is computed here, request 2 (case a) is read, the contents are exactly a compute's, and no block
  // stays held.
  for (const bool new_layout_first : {true, false}) {
    SCOPED_TRACE(new_layout_first ? "the new layout arrived" : "no new layout yet");
    pair_fixture f(16, 16, 128);
    const std::vector<token_id> p1 = prompt(100, 31), p2 = prompt(90, 32);
    prefill_and_offer(*f.P, *f.sender, f.to_d, 1, p1);
    std::vector<kv_offer> offers;
    ASSERT_TRUE(f.receiver->poll(offers).ok());
    ASSERT_EQ(offers.size(), 1U);
    f.D->add(1, offers[0].tokens, 3, static_cast<std::int32_t>(offers[0].computed));
    register_again(*f.P, *f.sender, !new_layout_first);
    if (new_layout_first) prefill_and_offer(*f.P, *f.sender, f.to_d, 2, p2);
    const std::size_t want = new_layout_first ? 2 : 1;
    std::vector<kv_received> got;
    std::map<seq_id, bool> checked;
    for (int i = 0; i < 200 && f.D->finished.size() < want; ++i) {
      const auto e = f.round(3);
      got.insert(got.end(), e.begin(), e.end());
      for (const seq_id id : {seq_id{1}, seq_id{2}})
        if (f.D->cache.contains(id) && *f.D->cache.load_state(id) == tier_load_state::none) {
          EXPECT_TRUE(f.D->holds(id, *f.D->cache.num_tokens(id))) << "request " << id;
          checked[id] = true;
        }
    }
    ASSERT_EQ(f.D->finished.size(), want) << "every request ends";
    EXPECT_EQ(checked.size(), want);
    EXPECT_EQ(f.start_failures, 1) << "request 1's read was never started";
    EXPECT_EQ(f.D->sched->stats().external_failures, 1) << "request 1 was computed here";
    EXPECT_EQ(f.D->starts[1].front(), 0) << "request 1 computed from its first token";
    if (new_layout_first) {
      ASSERT_EQ(got.size(), 1U);
      EXPECT_EQ(got[0].id, 2U);
      EXPECT_TRUE(got[0].ok) << "request 2 read through the new keys";
      EXPECT_EQ(f.D->starts[2].front(), 80);
    } else {
      EXPECT_TRUE(got.empty());
    }
    EXPECT_EQ(f.receiver->open_offers(), 0U);
    EXPECT_EQ(f.receiver->in_flight(), 0U);
    EXPECT_TRUE(f.P->sched->held().empty()) << "the sender was told of each request";
    EXPECT_TRUE(f.P->idle_and_empty());
    EXPECT_TRUE(f.D->idle_and_empty());
  }
}

/// inproc_transport counting the remote regions imported and not yet released.
struct counting_remotes : inproc_transport {
  std::int64_t live_remotes = 0;
  result<remote_handle> import_remote(peer_handle p, std::span<const std::byte> bytes) {
    result<remote_handle> r = inproc_transport::import_remote(p, bytes);
    if (r.ok()) ++live_remotes;
    return r;
  }
  status release_remote(remote_handle r) {
    const status st = inproc_transport::release_remote(r);
    if (st.ok()) --live_remotes;
    return st;
  }
};
static_assert(kv_transport<counting_remotes>);

TEST(Disaggregation, ANewLayoutWithAReadInFlightKeepsTheOldKeysUntilTheReadEnds) {
  const kv_geometry g{8, 16, kv_heads, head_dim, kv_dtype::f32};
  const kv_side side{*rank_layout(g, kv_heads * 2, 1, 0), 1, kv_pool_layout::per_layer};
  std::vector<std::byte> sp(static_cast<std::size_t>(side.region_bytes()), std::byte{7}), dp(sp.size());
  inproc_transport P;
  counting_remotes D;
  const auto [to_d, to_p] = inproc_transport::connect(P, D);
  const mem_handle pm[1] = {*P.register_memory(sp.data(), sp.size())};
  const mem_handle dm[1] = {*D.register_memory(dp.data(), dp.size())};
  // A region never registered, or registered and gone: refused at create and at replace_regions, nothing changed.
  const mem_handle never[1] = {42};
  EXPECT_EQ(kv_sender<inproc_transport>::create(P, side, never).code(), errc::invalid_argument);
  EXPECT_EQ(kv_receiver<counting_remotes>::create(D, to_p, side, never, 50ms).code(), errc::invalid_argument);
  result<kv_sender<inproc_transport>> sender = kv_sender<inproc_transport>::create(P, side, pm);
  result<kv_receiver<counting_remotes>> receiver = kv_receiver<counting_remotes>::create(D, to_p, side, dm, 5000ms);
  ASSERT_TRUE(sender.ok() && receiver.ok());
  const std::uint64_t g0 = sender->generation();
  EXPECT_EQ(sender->replace_regions(never).code(), errc::invalid_argument);
  EXPECT_EQ(sender->generation(), g0);

  const std::vector<token_id> p = prompt(40, 3);
  const block_id src[2] = {1, 2}, dst1[2] = {3, 4}, dst2[2] = {5, 6};
  ASSERT_TRUE(sender->offer(to_d, 1, p, 32, std::span<const block_id>(src)).ok());
  std::vector<kv_offer> offers;
  ASSERT_TRUE(receiver->poll(offers).ok());
  ASSERT_EQ(offers.size(), 1U);
  EXPECT_EQ(offers[0].layout, g0);
  EXPECT_EQ(D.live_remotes, 1);
  D.set_read_fault(inproc_transport::read_fault::hang);
  ASSERT_TRUE(receiver->start(1, std::span<const block_id>(dst1), 0, 32).ok());
  D.set_read_fault(inproc_transport::read_fault::none);

  // The sender's pool registered again (the old registration kept: a read may still use it), then an offer.
  const mem_handle pm2[1] = {*P.register_memory(sp.data(), sp.size())};
  ASSERT_TRUE(sender->replace_regions(pm2).ok());
  ASSERT_TRUE(sender->offer(to_d, 2, p, 32, std::span<const block_id>(src)).ok());
  offers.clear();
  ASSERT_TRUE(receiver->poll(offers).ok()) << "a new layout with a read in flight is taken";
  ASSERT_EQ(offers.size(), 1U);
  EXPECT_EQ(offers[0].layout, sender->generation());
  EXPECT_EQ(D.live_remotes, 2) << "the old key stays while read 1 uses it";
  ASSERT_TRUE(receiver->start(2, std::span<const block_id>(dst2), 0, 32).ok());
  std::vector<kv_received> ended;
  ASSERT_TRUE(receiver->progress(ended).ok());
  ASSERT_EQ(ended.size(), 1U);
  EXPECT_EQ(ended[0].id, 2U);
  EXPECT_TRUE(ended[0].ok);
  EXPECT_EQ(dp[static_cast<std::size_t>(side.offset(0, 5, 0, 0, 0))], std::byte{7});
  EXPECT_EQ(D.live_remotes, 2);
  // Read 1 ends (the sender goes): its key is released then, the layout in force keeps its own.
  ASSERT_TRUE(P.disconnect(to_d).ok());
  ended.clear();
  ASSERT_TRUE(receiver->progress(ended).ok());
  ASSERT_EQ(ended.size(), 1U);
  EXPECT_FALSE(ended[0].ok);
  EXPECT_EQ(D.live_remotes, 1);
  EXPECT_EQ(receiver->in_flight(), 0U);
}

/// The next whole message from `p` on `t` (bounded: the inproc transport has it at once or never).
std::vector<std::byte> next_message(inproc_transport& t, peer_handle p) {
  std::vector<std::byte> m;
  EXPECT_TRUE(*t.receive(p, m));
  return m;
}

TEST(Disaggregation, LayoutsAndOffersOutOfStepAreRefusedAndReported) {
  const kv_geometry g{8, 16, kv_heads, head_dim, kv_dtype::f32};
  const kv_side side{*rank_layout(g, kv_heads * 2, 1, 0), 1, kv_pool_layout::per_layer};
  std::vector<std::byte> sp(static_cast<std::size_t>(side.region_bytes())), dp(sp.size());
  inproc_transport P, D;
  const auto [to_d, to_p] = inproc_transport::connect(P, D);
  const mem_handle pm[1] = {*P.register_memory(sp.data(), sp.size())};
  const mem_handle dm[1] = {*D.register_memory(dp.data(), dp.size())};
  // A region registered and deregistered since: refused at create.
  const mem_handle gone[1] = {*D.register_memory(dp.data(), dp.size())};
  ASSERT_TRUE(D.deregister_memory(gone[0]).ok());
  EXPECT_EQ(kv_receiver<inproc_transport>::create(D, to_p, side, gone, 50ms).code(), errc::invalid_argument);
  result<kv_sender<inproc_transport>> a = kv_sender<inproc_transport>::create(P, side, pm);
  result<kv_receiver<inproc_transport>> receiver = kv_receiver<inproc_transport>::create(D, to_p, side, dm, 5000ms);
  ASSERT_TRUE(a.ok() && receiver.ok());
  const std::vector<token_id> p = prompt(40, 3);
  const block_id src[2] = {1, 2}, dst[2] = {3, 4};
  // Sender a's layout and its offer of request 1, taken off the wire to be sent again in other orders.
  ASSERT_TRUE(a->offer(to_d, 1, p, 32, std::span<const block_id>(src)).ok());
  const std::vector<std::byte> layout_a = next_message(D, to_p), offer_1 = next_message(D, to_p);
  std::vector<kv_offer> offers;
  std::vector<seq_id> refused, done;
  auto resend = [&](const std::vector<std::byte>& m) { ASSERT_TRUE(P.send(to_d, m).ok()); };
  // Generation 0: malformed, nothing taken.
  std::vector<std::byte> zero = layout_a;
  std::fill(zero.begin() + 4, zero.begin() + 12, std::byte{0});
  resend(zero);
  EXPECT_EQ(receiver->poll(offers).code(), errc::invalid_argument);
  EXPECT_FALSE(receiver->layout_ok());
  // The layout, then the same layout again (refused, the first stays in force), then the offer.
  resend(layout_a);
  EXPECT_TRUE(receiver->poll(offers).ok());
  EXPECT_TRUE(receiver->layout_ok());
  resend(layout_a);
  EXPECT_EQ(receiver->poll(offers).code(), errc::invalid_argument);
  EXPECT_TRUE(receiver->layout_ok());
  resend(offer_1);
  ASSERT_TRUE(receiver->poll(offers).ok());
  ASSERT_EQ(offers.size(), 1U);
  // Sender b on the same connection (another generation): its layout replaces a's; a's offer 1, still open, is
  // refused by start(), and a's next offer by poll(); b's offer is read.
  result<kv_sender<inproc_transport>> b = kv_sender<inproc_transport>::create(P, side, pm);
  ASSERT_TRUE(b.ok());
  ASSERT_NE(b->generation(), a->generation());
  ASSERT_TRUE(b->offer(to_d, 2, p, 32, std::span<const block_id>(src)).ok());
  ASSERT_TRUE(a->offer(to_d, 3, p, 32, std::span<const block_id>(src)).ok());
  offers.clear();
  ASSERT_TRUE(receiver->poll(offers).ok());
  ASSERT_EQ(offers.size(), 1U);
  EXPECT_EQ(offers[0].id, 2U);
  receiver->refused(refused);
  EXPECT_EQ(refused, std::vector<seq_id>{3}) << "an offer under a layout not in force is refused by poll";
  const status st1 = receiver->start(1, std::span<const block_id>(dst), 0, 32);
  EXPECT_EQ(st1.code(), errc::transport_error) << st1.message();
  EXPECT_EQ(receiver->in_flight(), 0U);
  EXPECT_TRUE(receiver->decline(1).ok());
  ASSERT_TRUE(receiver->start(2, std::span<const block_id>(dst), 0, 32).ok());
  std::vector<kv_received> ended;
  ASSERT_TRUE(receiver->progress(ended).ok());
  ASSERT_EQ(ended.size(), 1U);
  EXPECT_TRUE(ended[0].ok);
  ASSERT_TRUE(b->poll(to_d, done).ok());
  EXPECT_EQ(done, (std::vector<seq_id>{3, 1, 2})) << "the sender hears of every offer";
  // A malformed offer whose id can be read: declined, reported, the sender told.
  std::vector<std::byte> cut(offer_1.begin(), offer_1.begin() + 14);
  cut[4] = std::byte{9};
  resend(cut);
  EXPECT_EQ(receiver->poll(offers).code(), errc::invalid_argument);
  refused.clear();
  receiver->refused(refused);
  EXPECT_EQ(refused, std::vector<seq_id>{9});
  done.clear();
  ASSERT_TRUE(b->poll(to_d, done).ok());
  EXPECT_EQ(done, std::vector<seq_id>{9});
  // A new layout whose remote key this transport refuses, from a live sender: invalid_argument (transport_error
  // would say the sender is gone), no layout in force, its offers refused.
  result<kv_sender<inproc_transport>> c = kv_sender<inproc_transport>::create(P, side, pm);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->offer(to_d, 4, p, 32, std::span<const block_id>(src)).ok());
  std::vector<std::byte> layout_c = next_message(D, to_p);
  const std::vector<std::byte> offer_4 = next_message(D, to_p);
  layout_c.back() ^= std::byte{0x5A};
  resend(layout_c);
  resend(offer_4);
  const status bad_key = receiver->poll(offers);
  EXPECT_EQ(bad_key.code(), errc::invalid_argument) << bad_key.message();
  EXPECT_FALSE(receiver->layout_ok());
  EXPECT_TRUE(receiver->poll(offers).ok());
  refused.clear();
  receiver->refused(refused);
  EXPECT_EQ(refused, std::vector<seq_id>{4});
  EXPECT_EQ(receiver->open_offers(), 0U);
}

TEST(Disaggregation, TheCacheRefusesBadExternalCallsAndChangesNothing) {
  auto c = *cache_t::create(cache_config{16, 32, 0, 0});
  const std::vector<token_id> p = prompt(70, 4);
  EXPECT_EQ(c.add_sequence(1, p, sequence_options{.external_tokens = -1}).code(), errc::invalid_argument);
  EXPECT_EQ(c.add_sequence(1, 70).code(), errc::ok);
  EXPECT_EQ(c.external_blocks(1).code(), errc::invalid_argument);
  EXPECT_EQ(c.complete_external(1, true).code(), errc::invalid_argument);
  EXPECT_EQ(c.complete_external(5, true).code(), errc::unknown_sequence);
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, p, sequence_options{.external_tokens = 70}, &m).ok());
  EXPECT_EQ(m.external_blocks, 4);  // 69 tokens below the last: 4 full blocks
  EXPECT_EQ(*c.external_blocks(2), (external_range{0, 4}));
  EXPECT_EQ(*c.load_state(2), tier_load_state::loading);
  EXPECT_EQ(c.append_tokens(2).code(), errc::pending_append) << "a waiting sequence is not computed";
  EXPECT_EQ(*c.num_tokens(2), 64);
  // Freed while waiting: a read in flight may still write its blocks, so they stay held (and the id taken) until
  // the read is reported; then they come back, nothing committed.
  const std::int64_t before = c.available_blocks();
  ASSERT_TRUE(c.free_sequence(2).ok());
  EXPECT_EQ(c.available_blocks(), before);
  EXPECT_EQ(c.add_sequence(2, p).code(), errc::duplicate_sequence);
  EXPECT_EQ(c.available_blocks(), before);
  ASSERT_TRUE(c.complete_external(2, true).ok());
  EXPECT_EQ(c.available_blocks(), before + 4);
  EXPECT_EQ(c.match_prefix(p)->blocks, 0);
  EXPECT_EQ(c.complete_external(2, true).code(), errc::unknown_sequence);
  // A failed read has ended: freeing the sequence then frees its blocks at once.
  ASSERT_TRUE(c.add_sequence(3, p, sequence_options{.external_tokens = 70}).ok());
  ASSERT_TRUE(c.complete_external(3, false).ok());
  EXPECT_EQ(*c.load_state(3), tier_load_state::failed);
  ASSERT_TRUE(c.free_sequence(3).ok());
  EXPECT_EQ(c.available_blocks(), before + 4);
  EXPECT_TRUE(c.add_sequence(3, p).ok());
}

TEST(Disaggregation, OnlyACompletedHeldRequestKeepsItsSequence) {
  auto P = instance::make(16, 64);
  const std::vector<token_id> p = prompt(40, 8);
  // Cancelled: freed, not held.
  P->add(1, p, 1);
  ASSERT_TRUE(P->sched->hold(1).ok());
  P->sched->schedule();
  ASSERT_TRUE(P->sched->finish(1).ok());
  EXPECT_TRUE(P->sched->held().empty());
  // Completed: held until released; a fork child does not inherit the hold.
  P->add(2, p, 2);
  ASSERT_TRUE(P->sched->hold(2).ok());
  P->step();
  ASSERT_TRUE(P->sched->fork(2, 3).ok());
  P->max_new[3] = 2;
  P->prompt_len[3] = 40;
  for (int i = 0; i < 10 && P->finished.size() < 2; ++i) {
    const step_output& out = P->sched->schedule();
    for (const seq_id c : out.forked) P->tokens[c] = P->tokens[2];
    std::size_t k = 0;
    for (const scheduled_sequence& e : out.scheduled)
      for (std::int32_t q = e.start; q < e.start + e.num_tokens; ++q) {
        const std::int64_t slots[layers] = {out.slot_mapping[k], out.slot_mapping[k]};
        ++k;
        P->write(slots, e.id, q);
      }
    for (std::size_t i2 = 0; i2 < out.scheduled.size(); ++i2) {
      const seq_id id = out.scheduled[i2].id;
      P->tokens[id].push_back(5);
      const bool done = static_cast<std::int32_t>(P->tokens[id].size()) - 40 >= 2;
      ASSERT_TRUE(P->sched->complete_scheduled(i2, 5, done).ok());
      if (done) P->finished.push_back(id);
    }
  }
  ASSERT_EQ(P->sched->held().size(), 1U);
  EXPECT_EQ(P->sched->held()[0], 2U);
  EXPECT_FALSE(P->cache.contains(3));
  EXPECT_EQ(P->sched->release(3).code(), errc::unknown_sequence);
  ASSERT_TRUE(P->sched->release(2).ok());
  EXPECT_TRUE(P->idle_and_empty());
}

// ------------------------------------------------------------------------------------------------ KV cache groups
// hybrid_kv_cache on both sides (vLLM's conventions): layer 0 in a full-attention group, layer 1 in a 40-token
// sliding window. The receiver takes blocks only for the window entries its first computed token still reads.

using groups_pair = basic_pair<kv_groups_cache>;

TEST(DisaggregationGroups, EveryGroupsKvIsReadAndOnlyTheTailComputed) {
  for (const auto& [p_bs, d_bs] : {std::pair{16, 16}, std::pair{16, 32}, std::pair{32, 16}, std::pair{8, 64}}) {
    groups_pair f(p_bs, d_bs, 128);
    const std::vector<token_id> p = prompt(150, 21);
    prefill_and_offer(*f.P, *f.sender, f.to_d, 1, p);
    std::vector<kv_received> got;
    std::int64_t window_blocks = -1;
    for (int i = 0; i < 40 && f.D->finished.empty(); ++i) {
      const auto e = f.round(6);
      got.insert(got.end(), e.begin(), e.end());
      if (f.D->cache.contains(1) && *f.D->cache.load_state(1) == tier_load_state::loading && window_blocks < 0) {
        const auto t = f.D->tables(1);
        window_blocks = std::count_if(t[1].begin(), t[1].end(), [](block_id b) { return b != 0; });
        EXPECT_EQ(std::count(t[0].begin(), t[0].end(), 0), 0) << "full attention takes every entry";
      }
      if (f.D->cache.contains(1) && *f.D->cache.load_state(1) == tier_load_state::none) {
        EXPECT_TRUE(f.D->holds(1, *f.D->cache.num_tokens(1))) << p_bs << " -> " << d_bs;
      }
    }
    ASSERT_EQ(got.size(), 1U) << "block sizes " << p_bs << " -> " << d_bs;
    EXPECT_TRUE(got[0].ok);
    EXPECT_EQ(f.start_failures, 0);
    const std::int32_t ext = 149 / d_bs * d_bs;
    // The window group holds only the entries that the 40 tokens before position `ext` lie in.
    const std::int64_t first_read = std::max(0, ext - 40 + 1) / d_bs;
    EXPECT_EQ(window_blocks, ext / d_bs - first_read);
    const std::int64_t per_token = 2 * kv_heads * head_dim * 4;  // one layer
    EXPECT_EQ(got[0].bytes, (ext + (ext - first_read * d_bs)) * per_token);
    ASSERT_FALSE(f.D->starts[1].empty());
    EXPECT_EQ(f.D->starts[1].front(), ext);
    EXPECT_EQ(f.D->tokens[1].size(), 156U);
    EXPECT_TRUE(f.P->idle_and_empty());
    EXPECT_TRUE(f.D->idle_and_empty());
    // The received blocks are cached in both groups: the same prompt again is an agreed hit.
    f.D->add(2, p, 2);
    f.D->step();
    EXPECT_EQ(f.D->starts[2].front(), ext);
  }
}

TEST(DisaggregationGroups, ManyRequestsAndAChunkedSenderEndReadOrComputedWithExactContent) {
  // A prefill side that chunks its prompts (24 tokens a step) releases window blocks before the last chunk: where
  // the receiver needs one the sender released, the read cannot be planned and the request is computed here.
  for (const std::int64_t p_budget : {std::int64_t{8192}, std::int64_t{24}}) {
    groups_pair f(16, 32, 256, 5000ms, 8192, p_budget);
    std::vector<seq_id> ids;
    for (seq_id id = 1; id <= 8; ++id) {
      prefill_and_offer(*f.P, *f.sender, f.to_d, id, prompt(30 + static_cast<std::int32_t>(id) * 23, 300 + id));
      ids.push_back(id);
    }
    std::int64_t read = 0;
    for (int i = 0; i < 200 && f.D->finished.size() < ids.size(); ++i) {
      for (const kv_received& r : f.round(3)) read += r.ok ? 1 : 0;
      for (const seq_id id : ids)
        if (f.D->cache.contains(id) && *f.D->cache.load_state(id) == tier_load_state::none) {
          EXPECT_TRUE(f.D->holds(id, *f.D->cache.num_tokens(id))) << "request " << id;
        }
    }
    EXPECT_EQ(f.D->finished.size(), ids.size());
    EXPECT_EQ(read + f.start_failures, static_cast<std::int64_t>(ids.size()));
    if (p_budget == 8192) {
      EXPECT_EQ(f.start_failures, 0);
    }
    EXPECT_EQ(f.D->sched->stats().external_failures, f.start_failures);
    EXPECT_TRUE(f.P->idle_and_empty());
    EXPECT_TRUE(f.D->idle_and_empty());
  }
}

TEST(DisaggregationGroups, TheCacheHoldsAFreedSequencesExternalBlocksAndRefusesBadCalls) {
  const any_group_kind kinds[2] = {full_attention{}, sliding_window{20}};
  auto made = kv_groups_cache::create(cache_config{16, 64, 1, 0}, kinds, {hybrid_conventions::vllm});
  ASSERT_TRUE(made.ok());
  kv_groups_cache& c = *made;
  const std::vector<token_id> p = prompt(100, 5);
  const std::int64_t all = c.available_blocks();
  // Bad input changes nothing.
  EXPECT_EQ(c.add_sequence(1, p, sequence_options{.external_tokens = -1}).code(), errc::invalid_argument);
  EXPECT_EQ(c.add_sequence(1, std::span<const token_id>{}, sequence_options{.external_tokens = 16}).code(),
            errc::invalid_argument);
  EXPECT_EQ(c.available_blocks(), all);
  EXPECT_EQ(c.num_sequences(), 0);
  EXPECT_EQ(c.external_blocks(1).error().code(), errc::unknown_sequence);
  // 80 external tokens: entries [0, 5); the window (20 tokens before position 80) reads entries 3 and 4 only.
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(1, p, sequence_options{.external_tokens = 80}, &m).ok());
  EXPECT_EQ(m.external_blocks, 5);
  EXPECT_EQ(m.tokens, 80);
  EXPECT_EQ(*c.external_blocks(1), (external_range{0, 5}));
  EXPECT_EQ(*c.load_state(1), tier_load_state::loading);
  const auto t1 = *c.block_table(1, 1);
  ASSERT_EQ(t1.size(), 5U);
  EXPECT_EQ(t1[0], 0);
  EXPECT_EQ(t1[2], 0);
  EXPECT_NE(t1[3], 0);
  EXPECT_EQ(c.available_blocks(), all - 7);
  EXPECT_EQ(c.append_tokens(1, std::span<const token_id>(p).subspan(80, 1)).code(), errc::pending_append);
  EXPECT_EQ(c.complete_external(2, true).code(), errc::unknown_sequence);
  // Freed while reading: its 7 blocks stay held, its id taken, until the read is reported.
  ASSERT_TRUE(c.free_sequence(1).ok());
  EXPECT_EQ(c.available_blocks(), all - 7);
  EXPECT_EQ(c.add_sequence(1, p).code(), errc::duplicate_sequence);
  EXPECT_EQ(c.reset_prefix_cache().code(), errc::invalid_block);
  ASSERT_TRUE(c.complete_external(1, true).ok());
  EXPECT_EQ(c.available_blocks(), all);
  EXPECT_EQ(c.match_prefix(p)->blocks, 0);  // nothing was committed
  // Completed: committed in both groups, the rest appended; then an agreed hit of 5 blocks.
  ASSERT_TRUE(c.add_sequence(2, p, sequence_options{.external_tokens = 80}).ok());
  ASSERT_TRUE(c.complete_external(2, true).ok());
  EXPECT_EQ(*c.load_state(2), tier_load_state::none);
  EXPECT_EQ(c.external_blocks(2).error().code(), errc::invalid_argument);
  ASSERT_TRUE(c.append_tokens(2, std::span<const token_id>(p).subspan(80)).ok());
  EXPECT_EQ(*c.num_tokens(2), 100);
  EXPECT_EQ(c.match_prefix(p)->blocks, 6);
  ASSERT_TRUE(c.free_sequence(2).ok());
  // Its own cache holds more than the external tokens: nothing to wait for.
  ASSERT_TRUE(c.add_sequence(4, p, sequence_options{.external_tokens = 80}, &m).ok());
  EXPECT_EQ(m.external_blocks, 0);
  EXPECT_EQ(*c.load_state(4), tier_load_state::none);
  ASSERT_TRUE(c.free_sequence(4).ok());
  // A failed read has ended: freeing frees at once.
  const std::vector<token_id> q = prompt(100, 6);
  ASSERT_TRUE(c.add_sequence(3, q, sequence_options{.external_tokens = 80}).ok());
  EXPECT_EQ(c.add_sequence(3, q).code(), errc::duplicate_sequence);
  ASSERT_TRUE(c.complete_external(3, false).ok());
  EXPECT_EQ(*c.load_state(3), tier_load_state::failed);
  ASSERT_TRUE(c.free_sequence(3).ok());
  EXPECT_EQ(c.available_blocks(), all);
  // A hit and external KV past it: the window group takes neither the hit's blocks nor the external entries wholly
  // before the window of token 192 (entries 0-9 null; 10 and 11 new); the full group takes its 3 hits and 9 new.
  const std::vector<token_id> r = prompt(100, 9);
  ASSERT_TRUE(c.add_sequence(6, r).ok());  // computed here: every full block of r cached in both groups
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(6).ok());
  std::vector<token_id> b(r.begin(), r.begin() + 48);
  const std::vector<token_id> rest = prompt(152, 8);
  b.insert(b.end(), rest.begin(), rest.end());
  ASSERT_TRUE(c.add_sequence(5, b, sequence_options{.external_tokens = 192}, &m).ok());
  EXPECT_EQ(m.blocks, 3);
  EXPECT_EQ(m.external_blocks, 9);
  EXPECT_EQ(*c.external_blocks(5), (external_range{3, 9}));
  const auto w5 = *c.block_table(1, 5);
  ASSERT_EQ(w5.size(), 12U);
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(w5[i], 0) << "window entry " << i;
  EXPECT_NE(w5[10], 0);
  EXPECT_NE(w5[11], 0);
  EXPECT_EQ(c.available_blocks(), all - 14);
  ASSERT_TRUE(c.complete_external(5, true).ok());
  ASSERT_TRUE(c.append_tokens(5, std::span<const token_id>(b).subspan(192)).ok());
  c.begin_step();
  ASSERT_TRUE(c.free_sequence(5).ok());
  EXPECT_EQ(c.available_blocks(), all);
  EXPECT_EQ(c.match_prefix(b)->blocks, 12);
  EXPECT_TRUE(c.reset_prefix_cache().ok());
}

TEST(DisaggregationGroups, GroupsOfSeveralUnitsTakeAndHoldEveryPageOfTheirExternalEntries) {
  // Native conventions, the full-attention group two pages per entry: its external entries take both pages, a read
  // in flight holds both, and the companions' table mirrors the leads' (null where the window group is null).
  const any_group_kind kinds[2] = {full_attention{}, sliding_window{20}};
  const std::int32_t units[2] = {2, 1};
  auto made = kv_groups_cache::create(cache_config{16, 64, 1, 0}, kinds, {hybrid_conventions::native, units});
  ASSERT_TRUE(made.ok()) << made.error().message();
  kv_groups_cache& c = *made;
  ASSERT_EQ(c.num_tables(), 3);
  const std::vector<token_id> p = prompt(100, 7);
  const std::int64_t all = c.available_blocks();
  ASSERT_TRUE(c.add_sequence(1, p, sequence_options{.external_tokens = 80}).ok());
  EXPECT_EQ(c.available_blocks(), all - (5 * 2 + 2));
  const auto lead = *c.block_table(0, 1), pages = *c.block_table(c.unit_table(0, 1), 1);
  ASSERT_EQ(pages.size(), lead.size());
  for (std::size_t i = 0; i < lead.size(); ++i) EXPECT_NE(pages[i], lead[i]);
  ASSERT_TRUE(c.free_sequence(1).ok());
  EXPECT_EQ(c.available_blocks(), all - (5 * 2 + 2));
  ASSERT_TRUE(c.complete_external(1, true).ok());
  EXPECT_EQ(c.available_blocks(), all);
  ASSERT_TRUE(c.add_sequence(2, p, sequence_options{.external_tokens = 80}).ok());
  ASSERT_TRUE(c.complete_external(2, true).ok());
  ASSERT_TRUE(c.append_tokens(2, std::span<const token_id>(p).subspan(80)).ok());
  c.begin_step();  // the appended tokens are computed: their full block stays cached when the sequence is freed
  ASSERT_TRUE(c.free_sequence(2).ok());
  EXPECT_EQ(c.match_prefix(p)->blocks, 6);
  EXPECT_EQ(c.available_blocks(), all);
}

}  // namespace
}  // namespace kvpager
