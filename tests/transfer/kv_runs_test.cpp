// SPDX-License-Identifier: Apache-2.0
// plan_kv_runs moved by inproc_transport: a request's KV from every sender rank into every receiver rank, over
// every combination of block sizes 8/16/32/64 and tensor-parallel degrees 1/2/4 on both sides, per-layer and
// block-major pools, content checked token by token and head by head, and every other byte of the receiver left
// as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvpager/transfer/inproc_transport.hpp"
#include "kvpager/transfer/kv_runs.hpp"
#include "transfer_support.hpp"

namespace kvpager {
namespace {

using test::kv_rank;
using test::model;

TEST(KvRuns, EveryBlockSizeAndTensorParallelCombinationIsByteExact) {
  std::mt19937_64 rng(7);
  const std::int32_t sizes[] = {8, 16, 32, 64};
  const std::int32_t tps[] = {1, 2, 4};
  int cases = 0;
  for (const std::int32_t kv_heads : {4, 2, 1}) {
    for (const std::int32_t sbs : sizes) {
      for (const std::int32_t dbs : sizes) {
        for (const std::int32_t stp : tps) {
          for (const std::int32_t dtp : tps) {
#if KVPAGER_TEST_REDUCED
            if ((sbs + dbs + stp + dtp + kv_heads) % 3 != 0) continue;
#endif
            const model m{kv_heads, 3, 8, 16, kv_dtype::f16};
            const auto slay = static_cast<kv_pool_layout>(cases % 2);
            const auto dlay = static_cast<kv_pool_layout>((cases / 2) % 2);
            const std::int64_t tokens = 1 + static_cast<std::int64_t>(rng() % 150);
            std::vector<kv_rank> senders, receivers;
            for (std::int32_t r = 0; r < stp; ++r) senders.push_back(kv_rank::make(m, sbs, stp, r, slay, tokens, rng));
            for (std::int32_t r = 0; r < dtp; ++r) receivers.push_back(kv_rank::make(m, dbs, dtp, r, dlay, tokens, rng));
            for (kv_rank& s : senders) s.fill_request(m, tokens);
            // Every other case moves a range that starts inside the request (tokens a receiver's hit already has).
            const std::int64_t first = cases % 3 == 1 ? static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(tokens)) : 0;
            for (kv_rank& d : receivers) {
              std::int64_t moved = 0;
              for (kv_rank& s : senders) moved += test::move_request(s, d, tokens, first);
              const std::string where = "kv heads " + std::to_string(kv_heads) + ", block sizes " + std::to_string(sbs) +
                                        " -> " + std::to_string(dbs) + ", TP " + std::to_string(stp) + " -> " +
                                        std::to_string(dtp) + ", receiver rank " + std::to_string(d.side.rank.rank) +
                                        ", tokens " + std::to_string(first) + ".." + std::to_string(tokens);
              // Each head the receiver holds arrives once, from one sender rank: exactly its tokens' bytes.
              EXPECT_EQ(moved, (tokens - first) * 2 * d.side.rank.geometry.num_kv_heads * m.num_layers *
                                   kv_layout::of(d.side.rank.geometry).row_bytes())
                  << where;
              ASSERT_TRUE(d.request_matches(m, tokens, first)) << where;
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 20);
}

TEST(KvRuns, EqualLayoutsWithConsecutiveBlocksMergeIntoOneRunPerRegion) {
  const model m{2, 4, 8, 64, kv_dtype::bf16};
  for (const kv_pool_layout lay : {kv_pool_layout::per_layer, kv_pool_layout::block_major}) {
    const kv_side side{*rank_layout(kv_geometry{16, 16, 2, 64, kv_dtype::bf16}, 8, 1, 0), m.num_layers, lay};
    const std::vector<block_id> src{3, 4, 5, 6};
    const std::vector<block_id> dst{9, 10, 11, 12};
    std::vector<kv_run> runs;
    ASSERT_TRUE(plan_kv_runs(side, src, side, dst, 64, runs).ok());
    ASSERT_EQ(runs.size(), static_cast<std::size_t>(side.num_regions()));
    for (const kv_run& r : runs) EXPECT_EQ(r.bytes, 4 * block_bytes(side.rank.geometry, lay == kv_pool_layout::block_major ? m.num_layers : 1));
    // A partial last block moves only its tokens: the runs of the last block are per head.
    runs.clear();
    ASSERT_TRUE(plan_kv_runs(side, src, side, dst, 60, runs).ok());
    EXPECT_EQ(run_bytes(runs), 60 * 2 * 2 * 64 * 2 * m.num_layers);
  }
}

TEST(KvRuns, BadInputIsAnErrorAndLeavesTheOutputAsItWas) {
  const kv_geometry g{16, 16, 4, 64, kv_dtype::f16};
  const kv_side a{*rank_layout(g, 8, 1, 0), 2, kv_pool_layout::per_layer};
  const std::vector<block_id> t{1, 2, 3};
  std::vector<kv_run> out{kv_run{0, 0, 1, 2, 3}};
  const std::vector<kv_run> before = out;
  const auto expect_error = [&](const kv_side& s, std::span<const block_id> st, const kv_side& d,
                                std::span<const block_id> dt, std::int64_t n, errc code) {
    EXPECT_EQ(plan_kv_runs(s, st, d, dt, n, out).code(), code);
    EXPECT_EQ(out, before);
  };
  kv_side other = a;
  other.rank.geometry.head_dim = 128;
  expect_error(a, t, other, t, 40, errc::invalid_argument);
  other = a;
  other.rank.geometry.dtype = kv_dtype::bf16;
  expect_error(a, t, other, t, 40, errc::invalid_argument);
  other = a;
  other.num_layers = 3;
  expect_error(a, t, other, t, 40, errc::invalid_argument);
  other = a;
  other.rank.geometry.num_kv_heads = 8;
  expect_error(a, t, other, t, 40, errc::invalid_argument);  // a model with 8 KV heads against one with 4
  expect_error(a, t, a, t, 49, errc::invalid_argument);      // 49 tokens need 4 blocks of 16
  expect_error(a, t, a, t, -1, errc::invalid_argument);
  const std::vector<block_id> outside{1, 16, 3};
  expect_error(a, outside, a, t, 40, errc::invalid_block);
  expect_error(a, t, a, outside, 40, errc::invalid_block);
  other = a;
  other.num_layers = 0;
  expect_error(other, t, other, t, 40, errc::invalid_argument);
  other = a;
  other.rank.kv_head_begin = 1;  // heads [1, 5) of a model of 4
  expect_error(other, t, a, t, 40, errc::invalid_argument);
  ASSERT_TRUE(plan_kv_runs(a, t, a, t, 40, out).ok());
  EXPECT_GT(out.size(), before.size());
}

TEST(KvRuns, GroupsMoveEachLayerFromItsGroupsTableAndSkipTheReceiversNullEntries) {
  const model m{2, 4, 4, 32, kv_dtype::f32};
  std::mt19937_64 rng(3);
  const std::vector<std::int32_t> layer_groups{0, 1, 0, 1};
  const std::int64_t tokens = 70;
  for (const std::int32_t dbs : {8, 16, 32}) {
    kv_rank s = kv_rank::make(m, 16, 1, 0, kv_pool_layout::per_layer, tokens, rng);
    kv_rank d = kv_rank::make(m, dbs, 1, 0, kv_pool_layout::block_major, tokens, rng);
    s.layer_groups = layer_groups;
    d.layer_groups = layer_groups;
    s.add_group(tokens, rng);
    d.add_group(tokens, rng);
    // Group 1 is a window: the receiver holds only its last 20 tokens' blocks (the rest its null block 0); the
    // sender released every block wholly before token 30.
    const std::int64_t keep_from = tokens - 20;
    for (std::size_t j = 0; j < d.tables[1].size(); ++j)
      if (static_cast<std::int64_t>(j + 1) * dbs <= keep_from) d.tables[1][j] = 0;
    for (std::size_t j = 0; j < s.tables[1].size(); ++j)
      if (static_cast<std::int64_t>(j + 1) * 16 <= 30) s.tables[1][j] = 0;
    s.null_block = 0;
    d.null_block = 0;
    s.fill_request(m, tokens);
    test::move_request(s, d, tokens);
    EXPECT_TRUE(d.request_matches(m, tokens)) << "receiver block size " << dbs;
    // The receiver keeping a token the sender released is refused, and the caller's runs stay as they were, even
    // a last run that the first planned one would continue.
    std::vector<kv_run> first;
    ASSERT_TRUE(plan_kv_runs(s.side, s.tables_view(), d.side, d.tables_view(), tokens, first).ok());
    for (auto& b : s.tables[1]) b = 0;
    const kv_run before{first[0].src_region, first[0].dst_region, first[0].src_offset - 8, first[0].dst_offset - 8, 8};
    std::vector<kv_run> runs{before};
    const auto st = plan_kv_runs(s.side, s.tables_view(), d.side, d.tables_view(), tokens, runs);
    EXPECT_EQ(st.code(), errc::invalid_argument) << st.message();
    EXPECT_EQ(runs, std::vector<kv_run>{before});
  }
}

TEST(KvRuns, ReplicatedSenderHeadsAreReadFromTheReplicaOfTheReceiversRank) {
  // 2 KV heads over 4 ranks: sender ranks 0, 1 hold head 0 and ranks 2, 3 head 1. Receiver rank r (TP 4) reads its
  // head r / 2 from sender rank r, so the four receivers read from four different senders.
  const kv_geometry g{8, 16, 2, 16, kv_dtype::f16};
  for (std::int32_t r = 0; r < 4; ++r) {
    const kv_side d{*rank_layout(g, 4, 4, r), 1, kv_pool_layout::per_layer};
    for (std::int32_t s = 0; s < 4; ++s) {
      const kv_side src{*rank_layout(g, 4, 4, s), 1, kv_pool_layout::per_layer};
      std::vector<kv_run> runs;
      const std::vector<block_id> t{1};
      ASSERT_TRUE(plan_kv_runs(src, t, d, t, 16, runs).ok());
      EXPECT_EQ(runs.empty(), s != r) << "receiver " << r << ", sender " << s;
    }
  }
}

TEST(InprocTransport, FaultsStaleDescriptionsAndDisconnects) {
  inproc_transport a, b;
  const auto [ab, ba] = inproc_transport::connect(a, b);
  std::vector<std::byte> mem_a(256, std::byte{1}), mem_b(256, std::byte{2});
  const mem_handle ma = *a.register_memory(mem_a.data(), mem_a.size());
  const mem_handle mb = *b.register_memory(mem_b.data(), mem_b.size());
  std::vector<std::byte> desc;
  ASSERT_TRUE(a.describe(ma, desc).ok());
  const result<remote_handle> r = b.import_remote(ba, desc);
  ASSERT_TRUE(r.ok());
  const remote_handle rs[1] = {*r};
  const mem_handle ds[1] = {mb};
  const kv_run outside[1] = {kv_run{0, 0, 200, 0, 100}};
  EXPECT_EQ(b.read(ba, outside, rs, ds).code(), errc::invalid_argument);
  EXPECT_EQ(mem_b[0], std::byte{2});
  const kv_run run[1] = {kv_run{0, 0, 0, 8, 16}};
  b.set_read_fault(inproc_transport::read_fault::fail);
  result<transfer_handle> x = b.read(ba, run, rs, ds);
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(*b.poll(*x), transfer_state::failed);
  EXPECT_EQ(b.poll(*x).code(), errc::invalid_argument) << "a failed read's handle is ended";
  EXPECT_EQ(mem_b[8], std::byte{2});
  b.set_read_fault(inproc_transport::read_fault::hang);
  x = b.read(ba, run, rs, ds);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(*b.poll(*x), transfer_state::in_flight);
  b.set_read_fault(inproc_transport::read_fault::none);
  const result<transfer_handle> y = b.read(ba, run, rs, ds);
  EXPECT_EQ(*b.poll(*y), transfer_state::done);
  EXPECT_EQ(mem_b[8], std::byte{1});
  EXPECT_EQ(mem_b[7], std::byte{2});
  EXPECT_EQ(mem_b[24], std::byte{2});
  // A description of a region deregistered since is refused; a tampered one too.
  ASSERT_TRUE(a.deregister_memory(ma).ok());
  EXPECT_EQ(b.import_remote(ba, desc).code(), errc::transport_error);
  EXPECT_EQ(b.read(ba, run, rs, ds).code(), errc::transport_error);
  // Messages in order; after a disconnect the hung read fails and the peer is gone on both sides.
  const std::byte m1[2] = {std::byte{5}, std::byte{6}};
  ASSERT_TRUE(a.send(ab, m1).ok());
  std::vector<std::byte> got;
  EXPECT_TRUE(*b.receive(ba, got));
  EXPECT_EQ(got.size(), 2U);
  EXPECT_FALSE(*b.receive(ba, got));
  ASSERT_TRUE(a.disconnect(ab).ok());
  EXPECT_EQ(*b.poll(*x), transfer_state::failed);
  EXPECT_FALSE(b.peer_alive(ba));
  EXPECT_FALSE(a.peer_alive(ab));
  EXPECT_EQ(b.receive(ba, got).code(), errc::transport_error);
  EXPECT_EQ(a.send(ab, m1).code(), errc::transport_error);
  EXPECT_EQ(b.reads_in_flight(), 0U);
}

}  // namespace
}  // namespace kvpager
