// SPDX-License-Identifier: Apache-2.0
// hybrid_kv_cache (issue 24, point 1): per-group block tables over one pool. One full group decides as
// paged_kv_cache; a window group gives back the blocks before its window (kept hit-able); vLLM's conventions keep the
// release when the allocation fails, native ones change nothing; forks and copy-on-write work per group and the plan
// names the group; swap moves every group's table (one full group swaps as paged_kv_cache; null entries stay null;
// the swaps name their group); slot mappings and exports per group; bad input is refused with nothing changed; and,
// over random operations (swaps included) in both conventions, the per-group counts always add up to the pool's.

#include <kvpager/kvpager.hpp>

#include "cache/hybrid_test_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

using namespace kvpager;
using namespace kvpager_test;

namespace {

template <class C = hybrid>
C make(std::vector<any_group_kind> kinds, std::int32_t num_blocks, hybrid_conventions conv = hybrid_conventions::vllm,
       std::int32_t block_size = 4, std::int32_t host_blocks = 0) {
  auto r = C::create(config(num_blocks, block_size, host_blocks), kinds, {conv});
  EXPECT_TRUE(r) << r.error().message();
  return std::move(*r);
}

std::vector<block_id> table(const hybrid& c, std::int32_t g, seq_id id) {
  const auto t = c.block_table(g, id);
  EXPECT_TRUE(t);
  return std::vector<block_id>(t->begin(), t->end());
}

/// The pool's counts are the groups' counts: blocks with refcount > 0 by owner, table entries by group.
template <class C>
void expect_counts_add_up(const C& c, std::span<const seq_id> live) {
  std::int64_t blocks = 0;
  for (std::int32_t g = 0; g < c.num_groups(); ++g) {
    blocks += c.stats(g).blocks;
    std::int64_t entries = 0;
    std::vector<std::int32_t> owned(static_cast<std::size_t>(c.config().num_blocks), 0);
    for (const seq_id id : live) {
      if (c.is_swapped(id)) {  // host blocks: counted as table entries, not as the group's device blocks
        const auto ht = c.host_block_table(g, id);
        ASSERT_TRUE(ht);
        entries += static_cast<std::int64_t>(ht->size());
        for (const block_id hb : *ht) {
          if (hb != C::null_block) {
            ASSERT_GT(c.host_pool()->refcount(hb), 0);
          }
        }
        continue;
      }
      const auto t = c.block_table(g, id);
      ASSERT_TRUE(t);
      entries += static_cast<std::int64_t>(t->size());
      // Null entries only before the window of the next token: a prefix of the table.
      bool seen_block = false;
      for (const block_id b : *t) {
        if (b == C::null_block) {
          ASSERT_FALSE(seen_block) << "a null entry after a block in group " << g;
        } else {
          seen_block = true;
          ASSERT_GT(c.refcount(b), 0);
          ASSERT_EQ(c.owner_group(b), g);
        }
      }
    }
    EXPECT_EQ(entries, c.stats(g).table_entries) << "group " << g;
  }
  EXPECT_EQ(blocks, c.stats().used);
  EXPECT_EQ(c.used_blocks(), c.stats().total - c.available_blocks());
}

// One group whose kind skips nothing for these sequences decides as paged_kv_cache: random admissions (shared
// prefixes, so hits and evictions), decodes with token ids, forks and frees, on both. The group's kind and the
// conventions are the parameters (a window or chunk longer than any sequence takes the same one-pass lookup).
static void decides_as_paged_kv_cache(any_group_kind kind, hybrid_conventions conv) {
  std::mt19937 rng(7);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  auto ref = std::move(*vllm_v1_cache::create(config(48)));
  hybrid h = make({kind}, 48, conv);
  std::vector<seq_id> live;
  std::vector<std::vector<token_id>> toks(4000);
  seq_id next = 0;
  std::int64_t hits = 0, evictions_seen = 0, copies = 0, frozen = 0;  // frozen: steps with cancelled slots
  std::mt19937 steps(3);  // several operations per step: frees of sequences that appended in it, frozen slots
  std::vector<std::int64_t> ref_slots, h_slots;
  for (int op = 0; op < 20000; ++op) {
    if (steps() % 3 == 0) {
      ref.begin_step();
      h.begin_step();
    }
    const int what = pick(10);
    if (what < 3 || live.empty()) {
      const seq_id id = next++;
      if (id >= 4000) break;
      std::vector<token_id> t = tokens(4 * pick(4), 1000 * pick(3));  // one of three prefixes, 0..3 blocks
      const std::vector<token_id> tail = tokens(1 + pick(14), 100000 + 100 * static_cast<token_id>(id));
      t.insert(t.end(), tail.begin(), tail.end());
      prefix_match a, b;
      const status sa = ref.add_sequence(id, t, {}, &a), sb = h.add_sequence(id, t, {}, &b);
      ASSERT_EQ(sa.code(), sb.code()) << op;
      ASSERT_EQ(a, b) << op;
      if (sa) {
        live.push_back(id);
        toks[static_cast<std::size_t>(id)] = t;
        hits += a.blocks;
      }
    } else if (what < 7) {
      const seq_id id = live[static_cast<std::size_t>(pick(static_cast<int>(live.size())))];
      const token_id x = static_cast<token_id>(rng() % 7);
      ASSERT_EQ(ref.append_token(id, x).code(), h.append_token(id, x).code()) << op;
    } else if (what < 8) {
      const seq_id parent = live[static_cast<std::size_t>(pick(static_cast<int>(live.size())))];
      const seq_id id = next++;
      if (id >= 4000) break;
      const status sa = ref.fork(parent, id), sb = h.fork(parent, id);
      ASSERT_EQ(sa.code(), sb.code()) << op;
      if (sa) live.push_back(id);
    } else {
      const std::size_t i = static_cast<std::size_t>(pick(static_cast<int>(live.size())));
      ASSERT_TRUE(ref.free_sequence(live[i]));
      ASSERT_TRUE(h.free_sequence(live[i]));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    for (const seq_id id : live) {
      const auto t = ref.block_table(id);
      ASSERT_EQ(std::vector<block_id>(t->begin(), t->end()), table(h, 0, id)) << op;
    }
    ASSERT_EQ(ref.available_blocks(), h.available_blocks()) << op;
    ASSERT_EQ(ref.stats().evictions, h.stats().evictions) << op;
    ASSERT_EQ(ref.stats().cow_copies, h.stats().cow_copies) << op;
    ASSERT_EQ(ref.plan().copies().size(), h.plan().copies().size()) << op;
    ASSERT_EQ(ref.stats().pending_free, h.stats().pending_free) << op;
    ref_slots.resize(static_cast<std::size_t>(ref.slot_mapping_size()));
    h_slots.resize(static_cast<std::size_t>(h.slot_mapping_size()));
    ASSERT_TRUE(ref.export_slot_mapping(ref_slots));
    ASSERT_TRUE(h.export_slot_mapping(h_slots));
    ASSERT_EQ(ref_slots, h_slots) << op;
    frozen += std::count(ref_slots.begin(), ref_slots.end(), std::int64_t{-1}) > 0 ? 1 : 0;
    evictions_seen = ref.stats().evictions;
    copies = ref.stats().cow_copies;
  }
  EXPECT_GT(hits, 100);
  EXPECT_GT(evictions_seen, 100);
  EXPECT_GT(copies, 10);
  EXPECT_GT(frozen, 0);
}

TEST(HybridCache, OneFullGroupDecidesAsPagedKvCache) {
  decides_as_paged_kv_cache(full_attention{}, hybrid_conventions::vllm);
  decides_as_paged_kv_cache(full_attention{}, hybrid_conventions::native);
}

TEST(HybridCache, OneGroupLongerThanItsSequencesDecidesAsPagedKvCache) {
  decides_as_paged_kv_cache(sliding_window{1 << 20}, hybrid_conventions::vllm);
  decides_as_paged_kv_cache(chunked_local{1 << 20}, hybrid_conventions::native);
}

TEST(HybridCache, WindowGroupKeepsOnlyItsWindowAndItsBlocksStayHitable) {
  // [full, sliding_window 9], bs 4: a decoding sequence reads 9 tokens, so it holds at most cdiv(8, 4) + 1 = 3
  // blocks in the window group.
  hybrid c = make({full_attention{}, sliding_window{9}}, 200);
  const std::vector<token_id> prompt = tokens(40);
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(1, prompt, {}, &m));
  EXPECT_EQ(m.blocks_to_allocate, 20);  // 10 blocks in each group: the whole prompt in every group at admission
  EXPECT_EQ(c.stats(1).blocks, 10);
  std::vector<token_id> seq = prompt;
  for (token_id x = 0; x < 30; ++x) {
    c.begin_step();
    ASSERT_TRUE(c.append_token(1, 500 + x));
    seq.push_back(500 + x);
    const std::vector<block_id> w = table(c, 1, 1);
    const auto held = std::count_if(w.begin(), w.end(), [](block_id b) { return b != hybrid::null_block; });
    EXPECT_LE(held, 3);
    // The next token is at position seq.size() - 1 + 1; the last token appended (at n - 1) read [n - 9, n - 1]:
    // every block with one of those tokens is still there.
    const auto n = static_cast<std::int64_t>(seq.size());
    for (std::int64_t b = (n - 1 - 8) / 4; b < static_cast<std::int64_t>(w.size()); ++b)
      EXPECT_NE(w[static_cast<std::size_t>(b)], hybrid::null_block) << "token " << n;
    std::vector<seq_id> live{1};
    expect_counts_add_up(c, live);
  }
  EXPECT_EQ(c.stats(0).blocks, 18);  // 70 tokens
  EXPECT_EQ(c.stats(1).skipped_blocks, 15);
  EXPECT_EQ(c.stats(1).peak_blocks, 10);  // at admission: the whole prompt
  // Freed and asked again: every released window block kept its hash. Both groups hit 17 of the 18 blocks
  // (capped below the last token), the window group only its last 2 (cdiv(8, 4)) and nulls before them.
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_EQ(c.stats(0).blocks + c.stats(1).blocks, 0);
  c.begin_step();
  ASSERT_TRUE(c.add_sequence(2, seq, {}, &m));
  EXPECT_EQ(m.blocks, 17);
  const std::vector<block_id> w = table(c, 1, 2);
  EXPECT_EQ(std::count(w.begin(), w.begin() + 15, hybrid::null_block), 15);
  EXPECT_EQ(c.stats(1).hit_blocks, 2);
  EXPECT_EQ(c.stats(0).hit_blocks, 17);
  EXPECT_EQ(m.blocks_to_allocate, 1 + 17 + 1 + 2);  // the 18th block in each group, plus every hit that was free
  // A prompt cached whole in both groups hits in both.
  hybrid d = make({full_attention{}, sliding_window{9}}, 200);
  ASSERT_TRUE(d.add_sequence(1, prompt));
  ASSERT_TRUE(d.free_sequence(1));  // in the step that appended the prompt: never computed, nothing stays cached
  ASSERT_TRUE(d.add_sequence(2, prompt, {}, &m));
  EXPECT_EQ(m.blocks, 0);
  d.begin_step();
  ASSERT_TRUE(d.free_sequence(2));
  ASSERT_TRUE(d.add_sequence(3, prompt, {}, &m));
  EXPECT_EQ(m.blocks, 9);  // both groups cached every block: 9 of 10 (capped below the last token)
}

TEST(HybridCache, VllmKeepsTheReleaseWhenTheAllocationFailsNativeChangesNothing) {
  // bs 4, sliding_window 5 (= 1 mod 4): every block boundary releases one window block in the call that needs one
  // new block per group. With the pool exhausted the release alone cannot pay for two blocks.
  for (const hybrid_conventions conv : {hybrid_conventions::vllm, hybrid_conventions::native}) {
    SCOPED_TRACE(conv == hybrid_conventions::vllm ? "vllm" : "native");
    hybrid c = make({full_attention{}, sliding_window{5}}, 1 + 8, conv);  // 8 usable blocks
    ASSERT_TRUE(c.add_sequence(1, tokens(8)));  // 2 + 2 blocks
    ASSERT_TRUE(c.add_sequence(2, tokens(8, 50)));  // 2 + 2: the pool is full
    c.begin_step();
    // Sequence 1 at 8 tokens: its next token reads [4, 8], so block 0 of the window group goes; it needs block 2 in
    // both groups: 2 blocks, 1 available after the release.
    const std::vector<seq_id> ids{1, 2};
    const snapshot<hybrid> before(c, ids);
    const status st = c.append_token(1, 9);
    EXPECT_EQ(st.code(), errc::out_of_blocks);
    if (conv == hybrid_conventions::vllm) {
      EXPECT_EQ(table(c, 1, 1)[0], hybrid::null_block);  // released anyway, as vLLM's allocate_slots does
      EXPECT_EQ(c.available_blocks(), 1);
      EXPECT_EQ(c.stats(1).skipped_blocks, 1);
    } else {
      EXPECT_TRUE(snapshot<hybrid>(c, ids) == before);  // the strong guarantee
    }
    // Freeing sequence 2 makes room; now the release and the allocation happen in one call in both conventions.
    ASSERT_TRUE(c.free_sequence(2));
    c.begin_step();
    ASSERT_TRUE(c.append_token(1, 9));
    EXPECT_EQ(table(c, 1, 1)[0], hybrid::null_block);
    EXPECT_EQ(c.stats(1).skipped_blocks, 1);
    // Native: the release counts toward the capacity check. One block free, the window release frees one more.
    hybrid d = make({full_attention{}, sliding_window{5}}, 1 + 9, conv);
    ASSERT_TRUE(d.add_sequence(1, tokens(8)));
    ASSERT_TRUE(d.add_sequence(2, tokens(8, 50)));
    d.begin_step();
    EXPECT_TRUE(d.append_token(1, 9));
    EXPECT_EQ(d.available_blocks(), 0);
  }
}

TEST(HybridCache, ForkAndCopyOnWriteWorkPerGroupAndThePlanNamesTheGroup) {
  hybrid c = make({full_attention{}, sliding_window{6}}, 64);
  ASSERT_TRUE(c.add_sequence(1, tokens(10)));  // 3 blocks per group, the last one half full
  c.begin_step();
  ASSERT_TRUE(c.fork(1, 2));
  EXPECT_EQ(table(c, 0, 2), table(c, 0, 1));
  EXPECT_EQ(table(c, 1, 2), table(c, 1, 1));
  const block_id last0 = table(c, 0, 1)[2], last1 = table(c, 1, 1)[2];
  EXPECT_EQ(c.refcount(last0), 2);
  c.begin_step();
  ASSERT_TRUE(c.append_token(2, 77));  // writes into the shared partial last block of both groups
  ASSERT_EQ(c.plan().copies().size(), 2U);
  EXPECT_EQ(c.plan().copies()[0], (block_copy{last0, table(c, 0, 2)[2], 0}));
  EXPECT_EQ(c.plan().copies()[1], (block_copy{last1, table(c, 1, 2)[2], 1}));
  EXPECT_EQ(c.owner_group(table(c, 1, 2)[2]), 1);
  EXPECT_EQ(table(c, 0, 1)[2], last0);  // the parent keeps its blocks
  EXPECT_EQ(c.stats().cow_copies, 2);
  // Slot mappings differ per group; the group-major export holds both.
  std::vector<std::int64_t> g0(1), g1(1), all(2);
  ASSERT_TRUE(c.export_slot_mapping(0, g0));
  ASSERT_TRUE(c.export_slot_mapping(1, g1));
  ASSERT_TRUE(c.export_slot_mapping(all));
  EXPECT_EQ(g0[0], std::int64_t{table(c, 0, 2)[2]} * 4 + 2);
  EXPECT_EQ(g1[0], std::int64_t{table(c, 1, 2)[2]} * 4 + 2);
  EXPECT_EQ(all, (std::vector<std::int64_t>{g0[0], g1[0]}));
  EXPECT_EQ(c.slot_mapping_size(), 2);
  std::vector<std::int64_t> short_buffer(1);
  EXPECT_EQ(c.export_slot_mapping(short_buffer).code(), errc::buffer_too_small);
  EXPECT_EQ(c.export_slot_mapping(2, g0).code(), errc::invalid_argument);
  // Dense and CSR exports per group; the one-table exports ask for a group.
  const std::vector<seq_id> ids{1, 2};
  std::vector<std::int32_t> dense(8), lens(2), indptr(3), indices(6), last(2);
  ASSERT_TRUE(c.export_block_table(1, ids, dense, 4, lens));
  EXPECT_EQ(dense[4 + 2], table(c, 1, 2)[2]);
  EXPECT_EQ(lens[1], 11);
  ASSERT_EQ(*c.csr_size(1, ids), 6);
  ASSERT_TRUE(c.export_csr(1, ids, indptr, indices, last));
  EXPECT_EQ(last[1], 3);
  EXPECT_EQ(c.csr_size(ids).error().code(), errc::unsupported);
  // Decoding on past the window: the child's window group gives back what the parent still holds, by reference.
  for (token_id x = 0; x < 8; ++x) {
    c.begin_step();
    ASSERT_TRUE(c.append_token(2, x));
  }
  EXPECT_EQ(table(c, 1, 2)[0], hybrid::null_block);
  EXPECT_NE(table(c, 1, 1)[0], hybrid::null_block);  // the parent's table is its own
  EXPECT_EQ(c.refcount(table(c, 1, 1)[0]), 1);
  // A fork before the parent's window: the blocks the child would read are gone.
  c.begin_step();
  const std::vector<seq_id> live{1, 2};
  const snapshot<hybrid> before(c, live);
  EXPECT_EQ(c.fork(2, 3, 2).code(), errc::invalid_argument);
  EXPECT_TRUE(snapshot<hybrid>(c, live) == before);
  EXPECT_EQ(c.fork(2, 3, 16).code(), errc::invalid_argument);  // token 16 reads from 11 (block 2): released
  EXPECT_TRUE(c.fork(2, 3, 18));  // token 18 reads from 13 (block 3): still there
  const std::vector<seq_id> all_live{1, 2, 3};
  expect_counts_add_up(c, all_live);
}

TEST(HybridCache, OneFullGroupSwapsAsPagedKvCache) {
  // Random admissions, decodes, swaps out and in, and frees (swapped ones too) on a paged_kv_cache and a hybrid
  // cache of one full group, each with a host pool: the same tables on both sides, the same plans, the same counts.
  // The hybrid cache reserves host block 0 (its null entry): its host pool has one block more, and its host block
  // ids are paged_kv_cache's + 1.
  std::mt19937 rng(11);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  auto ref = std::move(*vllm_v1_cache::create(config(40, 4, 23)));
  hybrid h = make({full_attention{}}, 40, hybrid_conventions::vllm, 4, 24);
  std::vector<seq_id> live;
  seq_id next = 0;
  std::int64_t swaps = 0, refused = 0;
  for (int op = 0; op < 8000; ++op) {
    ref.begin_step();
    h.begin_step();
    const int what = pick(10);
    status sa, sb;
    if (what < 3 || live.empty()) {
      std::vector<token_id> t = tokens(4 * pick(3), 1000 * pick(2));
      const std::vector<token_id> tail = tokens(1 + pick(10), 100000 + 100 * static_cast<token_id>(next));
      t.insert(t.end(), tail.begin(), tail.end());
      sa = ref.add_sequence(next, t);
      sb = h.add_sequence(next, t);
      if (sa) live.push_back(next);
      ++next;
    } else if (what < 6) {
      const seq_id id = live[static_cast<std::size_t>(pick(static_cast<int>(live.size())))];
      sa = ref.append_token(id, 3);
      sb = h.append_token(id, 3);
    } else if (what < 9) {
      const seq_id id = live[static_cast<std::size_t>(pick(static_cast<int>(live.size())))];
      ASSERT_EQ(ref.is_swapped(id), h.is_swapped(id)) << op;
      if (ref.is_swapped(id)) {
        ASSERT_EQ(*ref.swap_in_blocks(id), *h.swap_in_blocks(id)) << op;
        sa = ref.swap_in(id);
        sb = h.swap_in(id);
      } else {
        sa = ref.swap_out(id);
        sb = h.swap_out(id);
      }
      swaps += sa ? 1 : 0;
      refused += sa ? 0 : 1;
    } else {
      const std::size_t i = static_cast<std::size_t>(pick(static_cast<int>(live.size())));
      sa = ref.free_sequence(live[i]);
      sb = h.free_sequence(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_EQ(sa.code(), sb.code()) << op << ": " << sa.message() << " / " << sb.message();
    for (const seq_id id : live) {
      const bool out = ref.is_swapped(id);
      ASSERT_EQ(out, h.is_swapped(id)) << op;
      const auto a = out ? ref.host_block_table(id) : ref.block_table(id);
      const auto b = out ? h.host_block_table(0, id) : h.block_table(0, id);
      std::vector<block_id> expect(a->begin(), a->end());
      if (out)
        for (block_id& x : expect) ++x;
      ASSERT_EQ(expect, std::vector<block_id>(b->begin(), b->end())) << op;
    }
    const auto shifted = [](std::span<const block_swap> ws) {
      std::vector<block_swap> v(ws.begin(), ws.end());
      for (block_swap& w : v) ++w.host;
      return v;
    };
    const auto hs = h.plan().swap_outs(), hi = h.plan().swap_ins();
    ASSERT_EQ(shifted(ref.plan().swap_outs()), std::vector<block_swap>(hs.begin(), hs.end())) << op;
    ASSERT_EQ(shifted(ref.plan().swap_ins()), std::vector<block_swap>(hi.begin(), hi.end())) << op;
    ASSERT_EQ(ref.available_blocks(), h.available_blocks()) << op;
    const cache_stats x = ref.stats(), y = h.stats();
    ASSERT_EQ(x.swapped, y.swapped) << op;
    ASSERT_EQ(x.host_free, y.host_free) << op;
    ASSERT_EQ(x.swapped_out_blocks, y.swapped_out_blocks) << op;
    ASSERT_EQ(x.swapped_in_blocks, y.swapped_in_blocks) << op;
    ASSERT_EQ(x.swapped_logical, y.swapped_logical) << op;
    ASSERT_EQ(x.evictions, y.evictions) << op;
  }
  EXPECT_GT(swaps, 500);
  EXPECT_GT(refused, 10);  // host pool full or device pool short, on both sides alike
}

TEST(HybridCache, SwapMovesEveryGroupKeepsNullEntriesAndNamesTheGroup) {
  // [full, sliding_window 5], bs 4: after 14 tokens the window group holds only its last 2 blocks.
  hybrid c = make({full_attention{}, sliding_window{5}}, 30, hybrid_conventions::vllm, 4, 10);
  const std::vector<token_id> prompt = tokens(13);
  ASSERT_TRUE(c.add_sequence(1, prompt));
  c.begin_step();
  ASSERT_TRUE(c.append_token(1, 99));  // 14 tokens: the window (tokens 9..13) leaves blocks 0 and 1 behind
  c.begin_step();
  const std::vector<block_id> full = table(c, 0, 1), win = table(c, 1, 1);
  ASSERT_EQ(win[0], hybrid::null_block);
  ASSERT_EQ(win[1], hybrid::null_block);
  std::vector<std::span<const block_id>> all;  // every table at once, in table order
  ASSERT_TRUE(c.block_tables(1, all));
  ASSERT_EQ(all.size(), 2U);
  EXPECT_TRUE(std::ranges::equal(all[0], full));
  EXPECT_TRUE(std::ranges::equal(all[1], win));
  EXPECT_EQ(c.block_tables(42, all).code(), errc::unknown_sequence);
  EXPECT_EQ(all.size(), 2U) << "a refused call leaves the output as it was";
  const std::int64_t avail = c.available_blocks();
  const group_stats g0 = c.stats(0), g1 = c.stats(1);
  EXPECT_EQ(*c.preempt_decision(1), preempt_action::unsupported);  // no_swap: explicit swaps only
  ASSERT_TRUE(c.swap_out(1));
  EXPECT_TRUE(c.is_swapped(1));
  EXPECT_EQ(c.stats().swapped, 1);
  EXPECT_EQ(c.stats(0).blocks, 0);
  EXPECT_EQ(c.stats(1).blocks, 0);
  EXPECT_EQ(c.stats(1).table_entries, g1.table_entries);  // the tables stay, on the host
  EXPECT_GE(c.available_blocks(), avail + 6);             // 4 + 2 blocks, kept hit-able as cached content
  // One swap per non-null block, naming the group whose layers move; null entries stay null on the host.
  ASSERT_EQ(c.plan().swap_outs().size(), 6U);
  for (const block_swap& w : c.plan().swap_outs()) {
    const bool in_full = std::find(full.begin(), full.end(), w.device) != full.end();
    const bool in_win = std::find(win.begin(), win.end(), w.device) != win.end();
    ASSERT_TRUE(in_full != in_win);
    EXPECT_EQ(w.group, in_full ? 0 : 1);
  }
  const auto host_win = c.host_block_table(1, 1);
  ASSERT_TRUE(host_win);
  EXPECT_EQ((*host_win)[0], hybrid::null_block);
  EXPECT_EQ((*host_win)[1], hybrid::null_block);
  EXPECT_EQ(*c.swap_in_blocks(1), 6);
  // While out: no decode, no fork, no export, no second swap-out; all refused with nothing changed.
  EXPECT_EQ(c.append_token(1, 5).code(), errc::sequence_swapped);
  EXPECT_EQ(c.fork(1, 2).code(), errc::sequence_swapped);
  EXPECT_EQ(c.block_table(0, 1).error().code(), errc::sequence_swapped);
  EXPECT_EQ(c.block_tables(1, all).code(), errc::sequence_swapped);
  EXPECT_EQ(c.swap_out(1).code(), errc::sequence_swapped);
  EXPECT_EQ(c.preempt(1).error().code(), errc::sequence_swapped);
  // The prompt's blocks are still found by another request (they kept their hashes on device).
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, prompt, {}, &m));
  EXPECT_EQ(m.blocks, 3);
  ASSERT_TRUE(c.free_sequence(2));
  c.begin_step();
  // Back in: same shape, nulls where they were, one swap-in per host block with its group, counts restored.
  ASSERT_TRUE(c.swap_in(1));
  EXPECT_FALSE(c.is_swapped(1));
  const std::vector<block_id> full2 = table(c, 0, 1), win2 = table(c, 1, 1);
  ASSERT_EQ(full2.size(), full.size());
  ASSERT_EQ(win2.size(), win.size());
  EXPECT_EQ(win2[0], hybrid::null_block);
  EXPECT_EQ(win2[1], hybrid::null_block);
  EXPECT_NE(win2[2], hybrid::null_block);
  ASSERT_EQ(c.plan().swap_ins().size(), 6U);
  for (const block_swap& w : c.plan().swap_ins()) {
    EXPECT_EQ(c.owner_group(w.device), w.group);
    EXPECT_TRUE(w.group == 0 ? std::find(full2.begin(), full2.end(), w.device) != full2.end()
                             : std::find(win2.begin(), win2.end(), w.device) != win2.end());
  }
  EXPECT_EQ(c.stats(0).blocks, g0.blocks);
  EXPECT_EQ(c.stats(1).blocks, g1.blocks);
  EXPECT_EQ(c.fork(1, 3).code(), errc::pending_append);  // its bytes arrive with this step's swap-ins
  c.begin_step();
  ASSERT_TRUE(c.append_token(1, 7));  // and it decodes on
  // A swap-out that finds the host pool short, and a swap-in that finds the device pool short: nothing changed.
  c.begin_step();
  ASSERT_TRUE(c.add_sequence(4, tokens(30, 500)));  // 8 + 8 blocks: the host pool (10) cannot take them
  c.begin_step();
  const std::vector<seq_id> both{1, 4};
  const snapshot<hybrid> before(c, both);
  EXPECT_EQ(c.swap_out(std::vector<seq_id>{1, 4}).code(), errc::host_pool_full);
  EXPECT_EQ(c.swap_out(std::vector<seq_id>{1, 1}).code(), errc::invalid_argument);
  EXPECT_TRUE(snapshot<hybrid>(c, both) == before);
  ASSERT_TRUE(c.swap_out(1));
  ASSERT_TRUE(c.add_sequence(5, tokens(16, 900)));  // 4 + 4 blocks: 5 left, swap_in needs 6
  c.begin_step();
  const std::vector<seq_id> three{1, 4, 5};
  const snapshot<hybrid> before_in(c, three);
  EXPECT_EQ(c.swap_in(1).code(), errc::out_of_blocks);
  EXPECT_TRUE(snapshot<hybrid>(c, three) == before_in);
  // Freeing a swapped sequence gives its host blocks back (at the next step).
  const std::int32_t host_free = c.stats().host_free;
  ASSERT_TRUE(c.free_sequence(1));
  c.begin_step();
  EXPECT_EQ(c.stats().host_free, host_free + 6);
  EXPECT_EQ(c.stats().swapped, 0);
}

TEST(HybridCache, PreemptSwapsEveryGroupWithASwapPolicy) {
  hybrid_swapping c = make<hybrid_swapping>({full_attention{}, sliding_window{5}}, 20, hybrid_conventions::native, 4, 8);
  ASSERT_TRUE(c.add_sequence(1, tokens(9)));
  c.begin_step();
  EXPECT_EQ(*c.preempt_decision(1), preempt_action::swap);
  const auto a = c.preempt(1);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, preempt_action::swap);
  EXPECT_TRUE(c.is_swapped(1));
  EXPECT_EQ(c.stats().preempted_swap, 1);
  ASSERT_TRUE(c.add_sequence(2, tokens(9, 50)));  // as many blocks again: the host pool (8) cannot take both
  c.begin_step();
  EXPECT_EQ(c.preempt(2).error().code(), errc::host_pool_full);
  EXPECT_FALSE(c.is_swapped(2));
}

TEST(HybridCache, FreedInTheStepItAppendedItsSlotsExportAsMinusOne) {
  hybrid c = make({full_attention{}, chunked_local{8}}, 64);
  ASSERT_TRUE(c.add_sequence(1, tokens(6)));
  ASSERT_TRUE(c.add_sequence(2, tokens(3, 90)));
  ASSERT_TRUE(c.free_sequence(1));
  std::vector<std::int64_t> all(static_cast<std::size_t>(c.slot_mapping_size()));
  ASSERT_EQ(all.size(), 18U);
  ASSERT_TRUE(c.export_slot_mapping(all));
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(all[i], -1);
  for (std::size_t i = 9; i < 15; ++i) EXPECT_EQ(all[i], -1);
  EXPECT_EQ(all[6], std::int64_t{table(c, 0, 2)[0]} * 4);
  EXPECT_EQ(all[15], std::int64_t{table(c, 1, 2)[0]} * 4);
}

TEST(HybridCache, AFreedSequencesSlotsInBlocksASharerHitAreKeptPerGroup) {
  // [full, sliding_window 16], bs 4: sequence 1 appends 10 tokens, sequence 2 hits its first two blocks in the
  // same step, then 1 is freed: in every group the slots in the shared blocks are kept, those in its own last block
  // are -1; the shared blocks stay busy, so freeing 2 in the same step parks them (not reused before the step ran).
  hybrid c = make({full_attention{}, sliding_window{16}}, 40);
  ASSERT_TRUE(c.add_sequence(1, tokens(10)));
  prefix_match m;
  ASSERT_TRUE(c.add_sequence(2, tokens(10), {}, &m));
  ASSERT_EQ(m.blocks, 2);
  const std::vector<block_id> t0 = table(c, 0, 1), t1 = table(c, 1, 1);
  ASSERT_TRUE(c.free_sequence(1));
  std::vector<std::int64_t> all(static_cast<std::size_t>(c.slot_mapping_size()));
  ASSERT_EQ(all.size(), 24U);  // 10 + 2 tokens, two groups
  ASSERT_TRUE(c.export_slot_mapping(all));
  for (std::int32_t g = 0; g < 2; ++g) {
    const std::vector<block_id>& t = g == 0 ? t0 : t1;
    const std::size_t base = static_cast<std::size_t>(g) * 12;
    for (std::size_t p = 0; p < 8; ++p)
      EXPECT_EQ(all[base + p], std::int64_t{t[p / 4]} * 4 + static_cast<std::int64_t>(p % 4)) << g << " " << p;
    EXPECT_EQ(all[base + 8], -1);
    EXPECT_EQ(all[base + 9], -1);
  }
  ASSERT_TRUE(c.free_sequence(2));
  EXPECT_EQ(c.stats().pending_free, 4);  // the 2 shared blocks of each group
  for (const block_id b : {t0[0], t0[1], t1[0], t1[1]}) EXPECT_FALSE(c.is_free(b));
  c.begin_step();
  EXPECT_EQ(c.stats().pending_free, 0);
}

TEST(HybridCache, BadInputIsRefusedAndChangesNothing) {
  const std::vector<any_group_kind> ok{full_attention{}, sliding_window{8}};
  EXPECT_EQ(hybrid::create(config(16), std::vector<any_group_kind>{}).error().code(), errc::invalid_argument);
  EXPECT_EQ(hybrid::create(config(16), std::vector<any_group_kind>{sliding_window{0}}).error().code(),
            errc::invalid_argument);
  EXPECT_EQ(hybrid::create(config(16), std::vector<any_group_kind>{chunked_local{-1}}).error().code(),
            errc::invalid_argument);
  cache_config no_null = config(16);
  no_null.reserved_blocks = 0;
  EXPECT_EQ(hybrid::create(no_null, ok).error().code(), errc::invalid_argument);
  cache_config host = config(16);
  host.num_host_blocks = -1;
  EXPECT_EQ(hybrid::create(host, ok).error().code(), errc::invalid_pool_size);
  host.num_host_blocks = 1;  // host block 0 is reserved: no usable host block
  EXPECT_EQ(hybrid::create(host, ok).error().code(), errc::invalid_pool_size);
  cache_config bad_bs = config(16);
  bad_bs.block_size = 12;
  EXPECT_EQ(hybrid::create(bad_bs, ok).error().code(), errc::invalid_block_size);
  // vLLM conventions take only layouts vLLM's grouping produces; native ones take any.
  const std::vector<any_group_kind> odd{full_attention{}, sliding_window{8}, full_attention{}};
  EXPECT_EQ(hybrid::create(config(16), odd).error().code(), errc::invalid_argument);
  EXPECT_TRUE(hybrid::create(config(16), odd, {hybrid_conventions::native}));
  EXPECT_EQ(hybrid::create(config(16), std::vector<any_group_kind>(65, full_attention{}), {hybrid_conventions::native})
                .error()
                .code(),
            errc::invalid_argument);
  // Calls that fail leave the cache as it was.
  hybrid c = make(ok, 12);
  ASSERT_TRUE(c.add_sequence(1, tokens(9)));
  const std::vector<seq_id> ids{1};
  const snapshot<hybrid> before(c, ids);
  EXPECT_EQ(c.add_sequence(1, tokens(3)).code(), errc::duplicate_sequence);
  EXPECT_EQ(c.add_sequence(2, tokens(40)).code(), errc::out_of_blocks);
  EXPECT_EQ(c.add_sequence(2, std::vector<token_id>{}).code(), errc::invalid_argument);
  EXPECT_EQ(c.add_sequence(2, 0).code(), errc::invalid_argument);
  EXPECT_EQ(c.append_token(7, 1).code(), errc::unknown_sequence);
  EXPECT_EQ(c.append_tokens(1, token_count{0}).code(), errc::invalid_argument);
  EXPECT_EQ(c.fork(1, 1).code(), errc::duplicate_sequence);
  EXPECT_EQ(c.fork(1, 2).code(), errc::pending_append);
  EXPECT_EQ(c.free_sequence(9).code(), errc::unknown_sequence);
  EXPECT_EQ(c.preempt(1).error().code(), errc::unsupported);  // no_swap: the scheduler recomputes
  EXPECT_EQ(c.swap_out(1).code(), errc::unsupported);          // no host pool
  EXPECT_EQ(c.host_block_table(0, 1).error().code(), errc::sequence_swapped);
  EXPECT_EQ(c.host_block_table(1).error().code(), errc::unsupported);  // per group
  EXPECT_EQ(c.swap_in_blocks(1).error().code(), errc::sequence_swapped);
  EXPECT_EQ(c.block_table(2, 1).error().code(), errc::invalid_argument);
  EXPECT_TRUE(snapshot<hybrid>(c, ids) == before);
  // A stale hit is refused.
  prefix_hit hit;
  ASSERT_TRUE(c.match_prefix(tokens(9), {}, hit));
  ASSERT_TRUE(c.free_sequence(1));
  EXPECT_TRUE(c.add_sequence(3, tokens(12, 300)));  // evicts nothing yet, but commits: the generation moved
  EXPECT_EQ(c.add_sequence(4, tokens(9), {}, hit).code(), errc::stale_prefix_hit);
}

// The kept lookup is reused only for the same blocks: the same hashes with other tokens (a caller's known hashes
// that collide) are looked up again, and the token check finds no hit.
TEST(HybridCache, AKeptLookupServesOnlyTheSameTokensWhateverTheHashes) {
  static_assert(hybrid::keeps_lookups);
  for (const auto conv : {hybrid_conventions::vllm, hybrid_conventions::native}) {
    hybrid c = make({full_attention{}, sliding_window{6}}, 40, conv);
    const std::vector<token_id> a = tokens(17, 10), b = tokens(17, 900);
    ASSERT_TRUE(c.add_sequence(1, a));
    prefix_hit ha, hb, again;
    ASSERT_TRUE(c.match_prefix(a, {}, ha));
    ASSERT_TRUE(c.match_prefix(a, {}, ha));  // looked up again: its cells are kept for the next lookup
    EXPECT_EQ(ha.match.blocks, 4);
    ASSERT_TRUE(c.match_prefix(b, {}, hb, ha.known_hashes));  // a's hashes, b's tokens: nothing to hit
    EXPECT_EQ(hb.match.blocks, 0);
    EXPECT_TRUE(hb.blocks.empty());
    ASSERT_TRUE(c.match_prefix(a, {}, again, ha.known_hashes));
    EXPECT_EQ(again.match, ha.match);
    EXPECT_EQ(again.blocks, ha.blocks);
  }
}

// A kept lookup serves another prompt that agrees on the blocks it read; what it then reads of that prompt must not
// serve the first prompt later (the memo keeps each block as it was looked up).
TEST(HybridCache, AKeptLookupThatServedAnotherPromptServesTheFirstOnlyWhereTheyAgree) {
  for (const auto conv : {hybrid_conventions::vllm, hybrid_conventions::native}) {
    hybrid c = make({full_attention{}, sliding_window{8}}, 40, conv);
    const std::vector<token_id> a = tokens(17, 10);
    std::vector<token_id> b = tokens(4, 10);  // a's first block, then its own
    const std::vector<token_id> tail = tokens(13, 700);
    b.insert(b.end(), tail.begin(), tail.end());
    prefix_hit h;
    ASSERT_TRUE(c.match_prefix(a, {}, h));
    ASSERT_TRUE(c.match_prefix(a, {}, h));  // kept: block 0 looked up (a miss)
    EXPECT_EQ(h.match.blocks, 0);
    ASSERT_TRUE(c.add_sequence(1, b));  // agrees with a on block 0: served by a's lookup, then commits b's blocks
    ASSERT_TRUE(c.match_prefix(b, {}, h));
    EXPECT_EQ(h.match.blocks, 4);
    ASSERT_TRUE(c.match_prefix(a, {}, h));
    hybrid copy = c;
    prefix_hit fresh;
    ASSERT_TRUE(copy.match_prefix(tokens(9, 500), {}, fresh));
    ASSERT_TRUE(copy.match_prefix(a, {}, fresh));
    EXPECT_EQ(fresh.match.blocks, 1);  // only block 0 is a's
    EXPECT_EQ(h.match, fresh.match);
    EXPECT_EQ(h.blocks, fresh.blocks);
  }
}

template <class C>
void random_operations(hybrid_conventions conv, std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  std::vector<any_group_kind> kinds;
  std::vector<vllm_kind> vk;
  do {
    kinds.clear();
    vk.clear();
    const int n = 1 + pick(4);
    for (int g = 0; g < n; ++g) {
      const int k = pick(3);
      if (k == 0) kinds.emplace_back(full_attention{});
      if (k == 1) kinds.emplace_back(sliding_window{1 + pick(20)});
      if (k == 2) kinds.emplace_back(chunked_local{1 + pick(20)});
      vk.push_back(vllm_kind_of(kinds.back()));
    }
  } while (conv == hybrid_conventions::vllm && !check_vllm_layout(vk));
  const std::int32_t bs = std::int32_t{1} << pick(3);
  C c = make<C>(kinds, 16 + pick(80), conv, bs, pick(3) == 0 ? 0 : 2 + pick(60));
  std::vector<seq_id> live;
  seq_id next = 0;
  std::int64_t failures = 0;
  std::vector<token_id> watch;  // a prompt looked up after every operation (the kept lookup against a fresh one)
  std::int64_t watched_hits = 0;
  for (int op = 0; op < 600; ++op) {
    if (pick(3) == 0) c.begin_step();
    const snapshot<C> before(c, live);
    status st;
    bool appended = false;
    const int what = pick(12);
    if (what < 3 || live.empty()) {
      std::vector<token_id> t = tokens(bs * pick(4), 7 * pick(2));
      const std::vector<token_id> tail = tokens(1 + pick(3 * bs), 1000 * static_cast<token_id>(next));
      t.insert(t.end(), tail.begin(), tail.end());
      st = pick(4) == 0 ? c.add_sequence(next, static_cast<std::int32_t>(t.size())) : c.add_sequence(next, t);
      if (st) live.push_back(next);
      if (watch.empty() || pick(8) == 0) watch = t;
      if (pick(4) == 0) watch.push_back(static_cast<token_id>(pick(1000)));  // often the same blocks, a new cap
      ++next;
    } else if (what < 9 && pick(5) == 0) {  // swap out or in, or preempt (the policy decides)
      const seq_id id = live[static_cast<std::size_t>(pick(static_cast<int>(live.size())))];
      if (c.is_swapped(id)) {
        st = c.swap_in(id);
      } else if (pick(2) == 0) {
        st = c.swap_out(id);
      } else {
        const auto a = c.preempt(id);
        st = a ? ok_status() : a.error();
        if (a && *a == preempt_action::recompute) live.erase(std::find(live.begin(), live.end(), id));
      }
    } else if (what < 9) {
      const seq_id id = live[static_cast<std::size_t>(pick(static_cast<int>(live.size())))];
      const std::vector<token_id> t = tokens(1 + pick(2 * bs), 50);
      appended = true;
      st = pick(4) == 0 ? c.append_tokens(id, token_count{static_cast<std::int32_t>(t.size())}) : c.append_tokens(id, t);
    } else if (what < 10) {
      const seq_id parent = live[static_cast<std::size_t>(pick(static_cast<int>(live.size())))];
      st = c.fork(parent, next, pick(2) == 0 ? 0 : 1 + pick(4 * bs));
      if (st) live.push_back(next);
      ++next;
    } else {
      const std::size_t i = static_cast<std::size_t>(pick(static_cast<int>(live.size())));
      ASSERT_TRUE(c.free_sequence(live[i]));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (!st) {
      ++failures;
      // Native: a failed call changed nothing. vLLM: only an append may have released window blocks (a swap-in
      // that finds no room releases nothing either).
      if (conv == hybrid_conventions::native || st.code() != errc::out_of_blocks || !appended) {
        ASSERT_TRUE(snapshot<C>(c, live) == before) << "op " << op << ": " << st.message();
      }
    }
    expect_counts_add_up(c, live);
    // The cache keeps the lookup of a prompt looked up again and re-checks it at its next lookup (find_hit's memo):
    // that answer must be a fresh lookup's. `watch` is looked up in `c` after every operation (kept from the last
    // one), and fresh in a copy whose memo another prompt took first; everything is compared.
    if (!watch.empty()) {
      prefix_hit kept, fresh;
      ASSERT_TRUE(c.match_prefix(watch, {}, kept));
      C copy = c;
      ASSERT_TRUE(copy.match_prefix(tokens(3 * bs + 1, 500), {}, fresh));
      ASSERT_TRUE(copy.match_prefix(watch, {}, fresh));
      ASSERT_EQ(kept.match, fresh.match) << "op " << op;
      ASSERT_EQ(kept.blocks, fresh.blocks) << "op " << op;
      watched_hits += kept.match.blocks;
    }
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(failures, 0);
  if (C::keeps_lookups) {
    EXPECT_GT(watched_hits, 0);
  }
}

TEST(HybridCache, RandomOperationsKeepEveryCountInBothConventions) {
#if defined(KVPAGER_TEST_REDUCED)
  constexpr std::uint32_t seeds = 15;  // the sanitizer and no-exception presets (92 s under ASan/UBSan with 60)
#else
  constexpr std::uint32_t seeds = 60;
#endif
  for (std::uint32_t seed = 0; seed < seeds; ++seed) {
    random_operations<hybrid>(hybrid_conventions::vllm, seed);
    random_operations<hybrid>(hybrid_conventions::native, 1000 + seed);
    random_operations<hybrid_no_caching>(hybrid_conventions::native, 2000 + seed);
    random_operations<hybrid_swapping>(hybrid_conventions::vllm, 3000 + seed);
    random_operations<hybrid_swapping>(hybrid_conventions::native, 4000 + seed);
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
