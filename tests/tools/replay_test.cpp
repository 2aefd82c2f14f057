// SPDX-License-Identifier: Apache-2.0
// kvpager-replay's engine: the four public traces give vLLM's exact counts; malformed traces give an error naming
// the line; randomly mutated traces never crash or hang.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kvtrace.hpp"
#include "replayer.hpp"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
const std::string data_dir = KVPAGER_TEST_DATA_DIR;

kvreplay::json replay_file(const std::string& trace_name) {
  const std::string text = read_file(data_dir + "/traces/" + trace_name + ".kvtrace");
  EXPECT_FALSE(text.empty()) << "missing test data for " << trace_name;
  const auto parsed = kvreplay::parse_kvtrace(text, trace_name);
  EXPECT_TRUE(parsed.value.has_value()) << parsed.error;
  if (!parsed.value) return {};
  const auto r = kvreplay::replay(*parsed.value, trace_name);
  EXPECT_TRUE(r.error.empty()) << r.error;
  return r.result;
}

void expect_matches_vllm(const std::string& trace_name, const std::vector<std::string>& keys) {
  const kvreplay::json got = replay_file(trace_name);
  const auto expected = kvreplay::json::parse(read_file(data_dir + "/expected/" + trace_name + ".json"));
  const auto& want = expected["workloads"][0]["result"];
  for (const std::string& k : keys) {
    ASSERT_TRUE(got.contains(k)) << k;
    const kvreplay::json w = want.contains(k) ? want[k] : kvreplay::json(0);  // absent zero counters
    if (w.is_number_float()) {
      EXPECT_DOUBLE_EQ(got[k].get<double>(), w.get<double>()) << trace_name << " " << k;
    } else {
      EXPECT_EQ(got[k].get<std::int64_t>(), w.get<std::int64_t>()) << trace_name << " " << k;
    }
  }
  // Traces with `group` records: the workload's groups and the per-group lists, one integer per group.
  if (!expected["workloads"][0].contains("groups")) return;
  const auto parsed = kvreplay::parse_kvtrace(read_file(data_dir + "/traces/" + trace_name + ".kvtrace"), trace_name);
  ASSERT_TRUE(parsed.value.has_value());
  EXPECT_EQ(kvreplay::workload_entry(*parsed.value, got)["groups"], expected["workloads"][0]["groups"]);
  for (const char* k : {"group_peak_blocks", "group_final_blocks", "group_hit_blocks", "group_skipped_blocks"}) {
    ASSERT_TRUE(got.contains(k)) << k;
    EXPECT_EQ(got[k], want[k]) << trace_name << " " << k;
  }
}

std::string manager_head_for_fork() { return "kvtrace 1\nworkload f\nlevel manager\nparam num_blocks 64\n"; }

const std::vector<std::string> manager_keys = {
    "hit_blocks",   "hit_tokens",         "query_tokens",       "resumed_hit_blocks", "resumed_hit_tokens",
    "resumed_query_tokens", "prefix_cache_evictions", "preemptions", "admit_fail", "admit_budget_stop",
    "decode_alloc_fail", "steps", "finished", "peak_usage", "final_usage"};

}  // namespace

TEST(ReplayVllm, A_AllocFreeChurn) {
  expect_matches_vllm("A_alloc_free_churn", {"alloc_calls", "free_calls", "blocks_allocated", "blocks_freed",
                                             "peak_used_blocks_incl_null", "final_free_blocks"});
}
TEST(ReplayVllm, B_PrefixCaching) { expect_matches_vllm("B_prefix_caching", manager_keys); }
TEST(ReplayVllm, C_DecodeGrowth) { expect_matches_vllm("C_decode_growth", manager_keys); }
TEST(ReplayVllm, D_PreemptionPressure) { expect_matches_vllm("D_preemption_pressure", manager_keys); }

// Hybrid KV cache groups (KVTRACE.md, "Hybrid KV cache groups"; issue 24): full + sliding_window 128 by explicit ops
// under eviction pressure, one sliding_window 256 group under preemption, full + chunked_local 512 under preemption:
// every deterministic count equals vLLM's HybridKVCacheCoordinator / UnitaryKVCacheCoordinator, per group too.
TEST(ReplayVllmHybrid, P1_FullAndSlidingWindow) { expect_matches_vllm("hybrid/P1_full_swa128_prefix", manager_keys); }
TEST(ReplayVllmHybrid, P2_SlidingWindowUnderPreemption) {
  expect_matches_vllm("hybrid/P2_swa256_preempt", manager_keys);
}
TEST(ReplayVllmHybrid, P3_FullAndChunkedLocal) { expect_matches_vllm("hybrid/P3_full_chunked512", manager_keys); }

// A window of 1 token: vLLM's lookup still asks for one cached block and returns it as the hit's last entry, which
// allocate_slots then skips (before the window of the first computed token): not touched, not counted in the need,
// left in the free queue, the null block in the table. Held-out traces checked against vLLM 0.22.0's manager: the
// smallest (an admission that fits only because the skipped hit is not taken), one group under a run, three groups
// (full, chunked_local 64, sliding_window 1) under a run, explicit ops with block size 8.
TEST(ReplayVllmHybrid, WindowOfOneSkipsTheHitBlock) {
  for (const char* t : {"hybrid/W1_admit_minimal", "hybrid/W1_swa1_bs32_run", "hybrid/W1_full_chunk64_swa1_run",
                        "hybrid/W1_swa1_bs8_explicit"})
    expect_matches_vllm(t, manager_keys);
}

// A trace without `group` records keeps its output (no group keys); with caching off a group trace hits nothing,
// evicts nothing, and its window groups still give blocks back.
TEST(ReplayVllmHybrid, GroupKeysOnlyForGroupTracesAndCachingOff) {
  EXPECT_FALSE(replay_file("C_decode_growth").contains("group_peak_blocks"));
  const std::string text = read_file(data_dir + "/traces/hybrid/P3_full_chunked512.kvtrace");
  auto parsed = kvreplay::parse_kvtrace(text, "P3");
  ASSERT_TRUE(parsed.value.has_value()) << parsed.error;
  kvreplay::trace t = *parsed.value;
  for (auto& [k, v] : t.params)
    if (k == "enable_caching") v = 0;
  const auto off = kvreplay::replay(t, "P3");
  ASSERT_TRUE(off.error.empty()) << off.error;
  EXPECT_EQ(off.result["hit_tokens"], 0);
  EXPECT_EQ(off.result["prefix_cache_evictions"], 0);
  EXPECT_EQ(off.result["group_hit_blocks"], kvreplay::json::parse("[0, 0]"));
  EXPECT_EQ(off.result["group_skipped_blocks"][0], 0);
  EXPECT_GT(off.result["group_skipped_blocks"][1].get<std::int64_t>(), 0);
  EXPECT_EQ(off.result["finished"], 200);
  EXPECT_EQ(off.result["group_final_blocks"], kvreplay::json::parse("[0, 0]"));
}

// With prefix caching off (vLLM's enable_caching=False) nothing is hit and nothing is evicted; trace C's schedule
// does not depend on caching, so its steps and peak usage stay the same.
TEST(ReplayVllm, CachingOffChangesOnlyHits) {
  const std::string text = read_file(data_dir + "/traces/C_decode_growth.kvtrace");
  auto parsed = kvreplay::parse_kvtrace(text, "C");
  ASSERT_TRUE(parsed.value.has_value()) << parsed.error;
  kvreplay::trace t = *parsed.value;
  for (auto& [k, v] : t.params)
    if (k == "enable_caching") v = 0;
  const auto off = kvreplay::replay(t, "C");
  ASSERT_TRUE(off.error.empty()) << off.error;
  const auto on = kvreplay::replay(*parsed.value, "C");
  EXPECT_EQ(off.result["steps"], on.result["steps"]);
  EXPECT_EQ(off.result["peak_usage"], on.result["peak_usage"]);
  EXPECT_EQ(off.result["hit_tokens"], 0);
  EXPECT_EQ(off.result["prefix_cache_evictions"], 0);
  EXPECT_EQ(off.result["query_tokens"], on.result["query_tokens"]);
}

// kvtrace extension: preemption modes. `preemption recompute` with the new params keeps vLLM's counts; swap and
// hybrid move victims to a host pool and bring every one of them back.
TEST(ReplayModes, TraceDInEveryMode) {
  const std::string text = read_file(data_dir + "/traces/D_preemption_pressure.kvtrace");
  auto with = [&](const std::string& mode, int host) {
    std::string t = text;
    const std::string anchor = "param max_num_batched_tokens 16384\n";
    t.replace(t.find(anchor), anchor.size(),
              anchor + "param preemption " + mode + "\nparam num_host_blocks " + std::to_string(host) + "\n");
    const auto parsed = kvreplay::parse_kvtrace(t, "D-" + mode);
    EXPECT_TRUE(parsed.value.has_value()) << parsed.error;
    const auto r = kvreplay::replay(*parsed.value, "D-" + mode);
    EXPECT_TRUE(r.error.empty()) << r.error;
    return r.result;
  };
  const auto expected = kvreplay::json::parse(read_file(data_dir + "/expected/D_preemption_pressure.json"));
  const auto& want = expected["workloads"][0]["result"];
  const auto rec = with("recompute", 1000);
  for (const char* k : {"preemptions", "steps", "admit_fail", "hit_tokens", "resumed_hit_tokens", "prefix_cache_evictions"})
    EXPECT_EQ(rec[k], want[k]) << k;
  EXPECT_EQ(rec["swap_outs"], 0);
  for (const std::string mode : {"swap", "hybrid"}) {
    const auto r = with(mode, 1000);
    EXPECT_GT(r["swap_outs"].get<std::int64_t>(), 0) << mode;
    EXPECT_EQ(r["swap_ins"], r["swap_outs"]) << mode << ": every swapped request comes back";
    EXPECT_EQ(r["finished"], 256) << mode;
    EXPECT_EQ(r["final_usage"], 0.0) << mode;
    EXPECT_FALSE(r["run_stalled"].get<bool>()) << mode;
  }
  // A host pool too small for most victims: hybrid recomputes them, swap falls back to recompute.
  const auto hybrid = with("hybrid", 40);
  EXPECT_GT(hybrid["preempted_recompute"].get<std::int64_t>(), 0);
  EXPECT_EQ(hybrid["swap_fallback_recompute"], 0);
  const auto swap = with("swap", 40);
  EXPECT_GT(swap["swap_fallback_recompute"].get<std::int64_t>(), 0);
}

TEST(ReplayModes, ForkSharesAndCopiesOnWrite) {
  const std::string text = manager_head_for_fork() + "param block_size 4\nreq 1 11 0 5:6\nadmit 1\nfork 1 2 99\n"
                           "decode 1 3\ndecode 2 3\nfinish 1\nfinish 2\n";
  const auto parsed = kvreplay::parse_kvtrace(text, "f");
  ASSERT_TRUE(parsed.value.has_value()) << parsed.error;
  const auto r = kvreplay::replay(*parsed.value, "f");
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.result["forks"], 1);
  EXPECT_EQ(r.result["cow_copies"], 1) << "the first write into the shared partial block copies it";
  EXPECT_EQ(r.result["final_usage"], 0.0);
}

// ------------------------------------------------------------------------------------------- malformed traces

namespace {
std::string replay_error(const std::string& text) {
  const auto parsed = kvreplay::parse_kvtrace(text, "t.kvtrace");
  if (!parsed.value) return parsed.error;
  return kvreplay::replay(*parsed.value, "t.kvtrace").error;
}
const std::string manager_head = "kvtrace 1\nworkload w\nlevel manager\nparam num_blocks 64\n";
const std::string pool_head = "kvtrace 1\nlevel pool\nparam num_blocks 64\n";
}  // namespace

TEST(ReplayErrors, EachNamesTheLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {manager_head + "req 1 5 4 9:10\nfrob 1\n", "t.kvtrace:6: unknown record 'frob'"},
      {manager_head + "req 1 5 x 9:10\n", "t.kvtrace:5: bad number 'x' for max_new"},
      {manager_head + "req 1 5 4 9:-3\n", "t.kvtrace:5: bad segment '9:-3'"},
      {manager_head + "req 1 5 4 9:99999999999999999999999\n", "t.kvtrace:5: bad segment"},
      {manager_head + "req 1 5 4\n", "t.kvtrace:5: 'req' takes"},
      {manager_head + "admit\n", "t.kvtrace:5: 'admit' takes a request id"},
      {manager_head + "req 1 5 4 9:10\ndecode 1\n", "t.kvtrace:6: 'decode' takes"},
      {manager_head + "admit 7\n", "t.kvtrace:5: request 7 is not defined"},
      {manager_head + "req 1 5 4 9:10\nreq 1 5 4 9:10\n", "t.kvtrace:6: request 1 is defined twice"},
      {manager_head + "req 1 5 4 9:10\nadmit 1\nadmit 1\n", "t.kvtrace:7: request 1 is already live"},
      {manager_head + "req 1 5 0 9:10\nrun 0\n", "t.kvtrace:6: 'run 0' with request 1"},
      {manager_head + "req 1 5 0 9:10\nrun 1073741825\n", "t.kvtrace:6: max_steps out of range"},
      {manager_head + "req 1 5 0 9:10\nrun 9223372036854775807\n", "t.kvtrace:6: max_steps out of range"},
      {manager_head + "alloc 1 2\n", "t.kvtrace:5: 'alloc' is a pool-level op"},
      {pool_head + "alloc 1 2\nfree 2\n", "t.kvtrace:5: free of slot 2, never allocated"},
      {pool_head + "alloc 1 64\n", "t.kvtrace:4: alloc of 64 blocks exceeds the free blocks (63)"},
      {pool_head + "req 1 5 4 9:10\n", "t.kvtrace:4: 'req' is a manager-level op"},
      {pool_head + "alloc 1 2\nparam block_size 16\n", "t.kvtrace:5: header record 'param' after the first op"},
      {"kvtrace 2\n", "t.kvtrace:1: unsupported kvtrace version"},
      {"level pool\n", "t.kvtrace:1: expected 'kvtrace 1'"},
      {"", "t.kvtrace:1: empty trace"},
      {"kvtrace 1\nparam num_blocks 8\nalloc 1 1\n", "t.kvtrace:3: missing 'level'"},
      {"kvtrace 1\nlevel pool\nalloc 1 1\n", "t.kvtrace:3: missing 'param num_blocks'"},
      {"kvtrace 1\nlevel pool\nparam num_blocks 8\nparam block_size 12\nalloc 1 1\n", "t.kvtrace:4: block_size must be"},
      {"kvtrace 1\nlevel pool\nparam num_blocks 999999999999\nalloc 1 1\n", "t.kvtrace:3: num_blocks must be"},
      {"kvtrace 1\nlevel pool\nparam num_blocks 8\nalloc 1", "t.kvtrace:4: 'alloc' takes"},  // truncated last line
      {manager_head + "param preemption often\n", "t.kvtrace:5: 'param preemption' must be"},
      {manager_head + "param preemption swap\nreq 1 5 4 9:10\n", "t.kvtrace:5: 'param preemption swap|hybrid' needs"},
      {manager_head + "param watermark_permille 1001\nreq 1 5 4 9:10\n", "t.kvtrace:5: watermark_permille must be"},
      {manager_head + "req 1 5 4 9:10\nfork 1 2\n", "t.kvtrace:6: 'fork' takes"},
      {manager_head + "req 1 5 4 9:10\nfork 3 2 7\n", "t.kvtrace:6: request 3 is not defined"},
      {manager_head + "req 1 5 4 9:10\nfork 1 1 7\n", "t.kvtrace:6: request 1 is defined twice"},
      {manager_head + "req 1 5 4 9:10\nfork 1 2 7\n", "t.kvtrace:6: fork: request 1 is not live"},
      {std::string("kvtrace 1\nlevel pool\nparam num_blocks 8\nalloc 1") + std::string(1, '\0') + " 1\n",
       "t.kvtrace:4: NUL byte"},
      // Hybrid KV cache groups: the records, their place, their sizes and the layouts vLLM can produce.
      {"kvtrace 1\ngroup full\n", "t.kvtrace:2: 'group' record before 'level'"},
      {pool_head + "group full\n", "t.kvtrace:4: 'group' record in a level pool trace"},
      {manager_head + "group mamba\n", "t.kvtrace:5: unknown group kind 'mamba'"},
      {manager_head + "group\n", "t.kvtrace:5: 'group' takes a kind"},
      {manager_head + "group full 4\n", "t.kvtrace:5: 'group full' takes no size"},
      {manager_head + "group sliding_window\n", "t.kvtrace:5: 'group sliding_window' takes one size"},
      {manager_head + "group sliding_window 0\n", "t.kvtrace:5: the window of 'group sliding_window' must be at least 1"},
      {manager_head + "group chunked_local x\n", "t.kvtrace:5: bad number 'x' for the chunk"},
      {manager_head + "group chunked_local 0\n", "t.kvtrace:5: the chunk of 'group chunked_local' must be at least 1"},
      {manager_head + "req 1 5 4 9:10\ngroup full\n", "t.kvtrace:6: header record 'group' after the first op"},
      {manager_head + "group full\nlevel manager\n", "t.kvtrace:6: 'level' record after a 'group' record"},
      {manager_head + "group full\ngroup sliding_window 8\ngroup full\nreq 1 5 4 9:10\n",
       "t.kvtrace:7: invalid group layout: vLLM layout: groups of one kind and size must be adjacent"},
      {manager_head + "group sliding_window 8\ngroup sliding_window 8\nreq 1 5 4 9:10\n",
       "t.kvtrace:5: invalid group layout: vLLM layout: identical groups form one group in vLLM"},
      {manager_head + "group full\ngroup full\ngroup sliding_window 8\ngroup sliding_window 8\n",
       "t.kvtrace:5: invalid group layout: vLLM layout: no kind occurs exactly once"},
      {manager_head + "param num_host_blocks 8\nparam preemption swap\ngroup full\ngroup sliding_window 4\nreq 1 5 4 9:10\n",
       "t.kvtrace:6: 'param preemption swap|hybrid' with 'group' records"},
  };
  for (const auto& [text, want] : cases) {
    const std::string err = replay_error(text);
    EXPECT_EQ(err.rfind(want, 0), 0U) << "got: " << err << "\nwant prefix: " << want;
  }
}

TEST(ReplayErrors, CommentsAndBlankLinesAreIgnored) {
  const std::string text = "# leading comment\n\nkvtrace 1 # magic\nlevel pool\nparam num_blocks 8 # eight\n\n"
                           "alloc 1 3   # three\n   \nfree 1\n";
  EXPECT_EQ(replay_error(text), "");
}

// ------------------------------------------------------------------------------------------- fuzzing

namespace {
/// Whether `error` has the form "NAME:LINE: message" with a positive LINE.
bool names_a_line(const std::string& error, const std::string& name) {
  if (error.rfind(name + ":", 0) != 0) return false;
  std::size_t i = name.size() + 1, digits = 0;
  while (i < error.size() && error[i] >= '0' && error[i] <= '9') ++i, ++digits;
  return digits > 0 && error[name.size() + 1] != '0' && error.compare(i, 2, ": ") == 0;
}

/// A random edit: drop, duplicate or swap a line, replace a field with junk, truncate, or insert bytes.
std::string mutate(std::string text, std::mt19937_64& rng) {
  static const std::vector<std::string> junk = {"-1", "0", "99999999999999999999", "x", ":", "1:", ":5", "1:0",
                                                "#", "\t", "4294967296", "run", "req", "free", "alloc", "admit 1",
                                                "decode 1 1000000", "9:16777216", "param", "level", "kvtrace 1", "fork 1 9 3",
                                                "param preemption hybrid", "param num_host_blocks 8", "caf\xe9",
                                                "\xff", "\xed\xa0\x80", "w\xc3\xa9"};
  std::vector<std::string> lines;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  if (lines.empty()) return text;
  const int edits = 1 + static_cast<int>(rng() % 3);
  for (int e = 0; e < edits; ++e) {
    const std::size_t i = rng() % lines.size();
    switch (rng() % 7) {
      case 0: lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(i)); break;
      case 1: lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), lines[i]); break;
      case 2: std::swap(lines[i], lines[rng() % lines.size()]); break;
      case 3: {  // replace one whitespace-separated field
        std::string& l = lines[i];
        std::vector<std::size_t> starts;
        for (std::size_t k = 0; k < l.size(); ++k)
          if (l[k] != ' ' && (k == 0 || l[k - 1] == ' ')) starts.push_back(k);
        if (starts.empty()) break;
        const std::size_t s = starts[rng() % starts.size()];
        std::size_t end = l.find(' ', s);
        if (end == std::string::npos) end = l.size();
        l.replace(s, end - s, junk[rng() % junk.size()]);
        break;
      }
      case 4: lines[i].resize(rng() % (lines[i].size() + 1)); break;
      case 5: lines[i].insert(rng() % (lines[i].size() + 1), 1, static_cast<char>(rng() % 256)); break;
      default: lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(i), junk[rng() % junk.size()]);
    }
    if (lines.empty()) break;
  }
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}
}  // namespace

TEST(ReplayFuzz, MutatedTracesNeverCrashOrHang) {
  // Small traces in each style: pool ops, explicit manager ops, and a scheduler run.
  const std::string pool = pool_head + "alloc 1 5\nalloc 2 7\nfree 1\nalloc 3 20\nalloc 1 1\nfree 3\nfree 2\nfree 1\n";
  const std::string explicit_ops = manager_head + "param block_size 4\nreq 1 11 0 5:9 6:3\nreq 2 12 0 5:9\n"
                                   "admit 1\ndecode 1 5\nadmit 2\ndecode 2 30\nfinish 1\ndecode 2 3\nfinish 2\n";
  const std::string run = manager_head + "param block_size 4\nparam max_num_batched_tokens 64\nparam max_num_seqs 4\n"
                          "req 1 11 40 5:9\nreq 2 12 30 5:9 7:7\nreq 3 13 50 8:20\nreq 4 14 20 9:3\nrun 0\n";
  std::mt19937_64 rng(20261130);
  int parsed_ok = 0, replayed_ok = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const std::string& base = iter % 3 == 0 ? pool : iter % 3 == 1 ? explicit_ops : run;
    const std::string text = mutate(base, rng);
    const auto parsed = kvreplay::parse_kvtrace(text, "fuzz");
    if (!parsed.value) {
      ASSERT_TRUE(names_a_line(parsed.error, "fuzz")) << parsed.error;
      continue;
    }
    ++parsed_ok;
    const auto r = kvreplay::replay(*parsed.value, "fuzz", kvreplay::replay_limits{20000, 200000});
    if (r.error.empty()) {
      ++replayed_ok;
      // What the tool prints: every accepted string is UTF-8, so this never throws (type_error.316 before).
      const std::string dumped = kvreplay::workload_entry(*parsed.value, r.result).dump();
      ASSERT_FALSE(dumped.empty());
    } else {
      ASSERT_TRUE(names_a_line(r.error, "fuzz")) << r.error;
    }
  }
  EXPECT_GT(parsed_ok, 2000);
  EXPECT_GT(replayed_ok, 1500);
}

// ------------------------------------------------------------------------------------------- no input aborts the tool

namespace {
/// Each way bytes fail to be UTF-8 (RFC 3629), with the byte the error must name.
const std::vector<std::pair<std::string, std::string>> invalid_utf8 = {
    {"\xff", "0xFF"},             {"\xfe", "0xFE"},         {"\x80", "0x80"},  // never in UTF-8; lone continuation
    {"\xc0\x80", "0xC0"},         {"\xe0\x80\x80", "0xE0"}, {"\xf0\x80\x80\x80", "0xF0"},  // overlong forms
    {"\xed\xa0\x80", "0xED"},                                                             // a UTF-16 surrogate
    {"\xf4\x90\x80\x80", "0xF4"}, {"\xf5\x80\x80\x80", "0xF5"},                           // above U+10FFFF
    {"\xe2\x82", "0xE2"},         {"\xc3", "0xC3"},                                       // truncated
    {"\xe9", "0xE9"}};                                                                    // Latin-1

/// `text` with its single '@' replaced by `bytes`; `line` and `column` (1-based) say where '@' was.
std::string place(const std::string& text, const std::string& bytes, std::int64_t& line, std::size_t& column) {
  const std::size_t at = text.find('@');
  const std::size_t bol = text.rfind('\n', at);
  line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n');
  column = at - (bol == std::string::npos ? 0 : bol + 1) + 1;
  return text.substr(0, at) + bytes + text.substr(at + 1);
}
}  // namespace

// Issue 9 item 4: one non-UTF-8 byte in a workload name or param key made the JSON writer throw
// (type_error.316) and the tool abort. Every record is checked where it is read, whatever field holds the bytes.
TEST(ReplayErrors, NonUtf8ByteInAnyStringFieldIsAnErrorNamingTheLine) {
  const std::vector<std::string> templates = {
      "kvtrace 1\nworkload w@\nlevel pool\nparam num_blocks 8\nalloc 1 1\n",                // workload name
      "kvtrace 1\nworkload w\nlevel pool\nparam num_blocks 8\nparam k@y 3\n",               // param key, no ops
      "kvtrace 1\nworkload w\nlevel pool\nparam k@y 3\nparam num_blocks 8\nalloc 1 1\n",    // param key, ops
      "kvtrace 1\nlevel pool\nparam num_blocks 8@\n",                                        // param value
      "kvtrace 1\nlevel manager\nparam num_blocks 8\nparam preemption swap@\n",             // preemption value
      "kvtrace 1@\nlevel pool\nparam num_blocks 8\n",                                        // magic
      "kvtrace 1\nlevel pool@\nparam num_blocks 8\n",                                        // level
      "kvtrace 1\nwork@load w\nlevel pool\nparam num_blocks 8\n",                            // keyword
      "kvtrace 1\nlevel pool\nparam num_blocks 8\nalloc 1 1\nfree@ 1\n",                     // op
      "kvtrace 1\nlevel manager\nparam num_blocks 8\nreq 1 5 4 9:10 @\nrun 0\n",             // a field of its own
      "@kvtrace 1\n",                                                                        // first byte
  };
  for (const std::string& tpl : templates) {
    for (const auto& [bytes, hex] : invalid_utf8) {
      std::int64_t line = 0;
      std::size_t column = 0;
      const std::string text = place(tpl, bytes, line, column);
      const std::string want =
          "t.kvtrace:" + std::to_string(line) + ": invalid UTF-8 (byte " + hex + " at column " + std::to_string(column) + ")";
      EXPECT_EQ(replay_error(text), want) << "template:\n" << tpl;
    }
  }
  EXPECT_EQ(kvreplay::detail::invalid_utf8_at("ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"), std::string_view::npos);
  EXPECT_EQ(kvreplay::detail::invalid_utf8_at("ab\xed\x9f\xbf\xed\xa0\x80"), 5U) << "U+D7FF is valid, U+D800 is not";
}

// Comments are never stored or echoed: any bytes there are allowed. Valid UTF-8 names round-trip into the JSON.
TEST(ReplayErrors, Utf8NamesAreEchoedAndCommentsMayHoldAnyBytes) {
  const std::string text = "kvtrace 1 # \xff\xfe\nworkload caf\xc3\xa9-\xf0\x9f\x98\x80\nlevel pool\n"
                           "param num_blocks 8\nparam cl\xc3\xa9 3 # \xc0\x80\nalloc 1 1 #\xe9\n";
  const auto parsed = kvreplay::parse_kvtrace(text, "t");
  ASSERT_TRUE(parsed.value.has_value()) << parsed.error;
  const auto r = kvreplay::replay(*parsed.value, "t");
  ASSERT_EQ(r.error, "");
  const kvreplay::json entry = kvreplay::workload_entry(*parsed.value, r.result);
  const auto back = kvreplay::json::parse(entry.dump());
  EXPECT_EQ(back["workload"], "caf\xc3\xa9-\xf0\x9f\x98\x80");
  EXPECT_EQ(back["params"]["cl\xc3\xa9"], 3);
  EXPECT_EQ(back["ops"], 1);
}

// Issue 9 item 10: a trace with no ops skipped every param range check (a huge pool aborted with bad_alloc, a bad
// block size gave an error without a line). Each param is checked at its own line, with or without ops after it.
TEST(ReplayErrors, ParamOutOfRangeIsReportedAtItsLineWithOrWithoutOps) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"num_blocks 1", "num_blocks must be in [2, 2^24]"},
      {"num_blocks 16777217", "num_blocks must be in [2, 2^24]"},
      {"num_blocks 4294967296", "num_blocks must be in [2, 2^24]"},
      {"block_size 0", "block_size must be a power of two <= 4096"},
      {"block_size 24", "block_size must be a power of two <= 4096"},
      {"block_size 8192", "block_size must be a power of two <= 4096"},
      {"enable_caching 2", "enable_caching must be 0 or 1"},
      {"max_num_seqs 0", "max_num_seqs must be positive"},
      {"max_num_batched_tokens 0", "max_num_batched_tokens must be positive"},
      {"watermark_permille 1001", "watermark_permille must be in [0, 1000]"},
      {"num_host_blocks 16777217", "num_host_blocks must be <= 2^24"},
  };
  for (const auto& [param, message] : bad) {
    const bool is_num_blocks = param.rfind("num_blocks", 0) == 0;
    for (const std::string level : {"pool", "manager"}) {
      const std::string head = "kvtrace 1\nlevel " + level + "\n" + (is_num_blocks ? "" : "param num_blocks 64\n");
      const std::string line = is_num_blocks ? "3" : "4";
      const std::string ops = level == "pool" ? "alloc 1 1\n" : "req 1 5 4 9:10\nrun 0\n";
      for (const std::string& tail : {std::string(), ops, "param max_model_len 10\n" + ops}) {
        const std::string text = head + "param " + param + "\n" + tail;
        EXPECT_EQ(replay_error(text), "t.kvtrace:" + line + ": " + message) << text;
      }
    }
  }
  // The bounds themselves are allowed (parsed only: a 2^24-block cache is not built here).
  for (const std::string param : {"num_blocks 2", "num_blocks 16777216", "block_size 1", "block_size 4096",
                                  "enable_caching 0", "max_num_seqs 1", "watermark_permille 1000",
                                  "num_host_blocks 16777216", "max_model_len 0"}) {
    const auto parsed = kvreplay::parse_kvtrace("kvtrace 1\nlevel manager\nparam num_blocks 64\nparam " + param + "\n", "t");
    if (param.rfind("num_blocks", 0) == 0) {
      EXPECT_EQ(parsed.error, "t:4: duplicate param num_blocks");
      const auto alone = kvreplay::parse_kvtrace("kvtrace 1\nlevel manager\nparam " + param + "\n", "t");
      EXPECT_TRUE(alone.value.has_value()) << param << ": " << alone.error;
    } else {
      EXPECT_TRUE(parsed.value.has_value()) << param << ": " << parsed.error;
    }
  }
  // A conflict between params is reported at the param that needs the other, also without ops.
  EXPECT_EQ(replay_error(manager_head + "param preemption hybrid\nparam max_model_len 9\n"),
            "t.kvtrace:5: 'param preemption swap|hybrid' needs 'param num_host_blocks' > 0");
  EXPECT_EQ(replay_error(manager_head + "param preemption swap\nparam num_host_blocks 0\n"),
            "t.kvtrace:5: 'param preemption swap|hybrid' needs 'param num_host_blocks' > 0");
  EXPECT_EQ(replay_error(manager_head + "param num_host_blocks 4\nparam preemption swap\n"), "");
  EXPECT_EQ(replay_error("kvtrace 1\nlevel pool\n"), "t.kvtrace:3: missing 'param num_blocks'");
  EXPECT_EQ(replay_error("kvtrace 1\nparam num_blocks 8\n"), "t.kvtrace:3: missing 'level' record");
}

namespace {
using v1 = kvpager::vllm_v1_cache;

/// vLLM's cache under another type, so a test can replace one of its calls (create, fork, add_sequence): `Derived`
/// derives from it and declares the replacement, which hides the base's.
template <class Derived>
struct v1_with : v1 {
  explicit v1_with(v1 c) : v1(std::move(c)) {}
  static kvpager::result<Derived> create(kvpager::cache_config cfg, v1::policies = {}) {
    auto c = v1::create(cfg);
    if (!c) return c.error();
    return Derived(std::move(*c));
  }
};

/// vLLM's cache whose create answers an error, as a cache too large for memory does (errc::out_of_memory).
struct create_fails : v1_with<create_fails> {
  using v1_with::v1_with;
  static kvpager::result<create_fails> create(kvpager::cache_config, v1::policies = {}) {
    return kvpager::status{kvpager::errc::invalid_argument, "create: no memory for this test", 0};
  }
};
/// vLLM's cache whose forks fail (as a copy-mode sharing policy's can, out of blocks).
struct fork_fails : v1_with<fork_fails> {
  using v1_with::v1_with;
  kvpager::status fork(kvpager::seq_id, kvpager::seq_id, std::int32_t = 0) {
    return kvpager::status{kvpager::errc::out_of_blocks, "fork: refused by this test", 0};
  }
};
#if KVPAGER_HAS_EXCEPTIONS
/// vLLM's cache whose create throws std::bad_alloc, as paged_kv_cache::create did for 2^24 blocks of 4096 tokens.
struct create_throws : v1_with<create_throws> {
  using v1_with::v1_with;
  static kvpager::result<create_throws> create(kvpager::cache_config, v1::policies = {}) {
    throw std::bad_alloc();
  }
};
/// vLLM's cache whose admissions throw std::bad_alloc (memory exhausted in the middle of a replay).
struct admission_throws : v1_with<admission_throws> {
  using v1_with::v1_with;
  using v1_with::add_sequence;  // the scheduler's overloads (a prefix_hit) stay visible
  kvpager::status add_sequence(kvpager::seq_id, std::span<const kvpager::token_id>, kvpager::sequence_options = {},
                               kvpager::prefix_match* = nullptr) {
    throw std::bad_alloc();
  }
};
#endif
}  // namespace

// Issue 9 item 11: params inside the parser's limits whose cache does not fit in memory made create throw
// std::bad_alloc and the tool abort. Whatever create answers (an error, or bad_alloc), the replay reports it at the
// `param num_blocks` line with the params; memory exhausted during an op is reported at the op's line.
TEST(ReplayErrors, CacheThatCannotBeCreatedIsAnErrorAtTheParamsLine) {
  const std::string text = "kvtrace 1\nlevel manager\nparam block_size 16\nparam num_blocks 64\nreq 1 5 4 9:10\nadmit 1\n";
  const auto parsed = kvreplay::parse_kvtrace(text, "t");
  ASSERT_TRUE(parsed.value.has_value()) << parsed.error;
  const std::string where = "t:4: cannot create the cache for num_blocks 64, block_size 16, prefix caching on: ";
  const auto failed = kvreplay::detail::replay_manager<create_fails>(*parsed.value, "t", {});
  EXPECT_EQ(failed.error, where + "create: no memory for this test");
#if KVPAGER_HAS_EXCEPTIONS
  auto guarded = [&](auto cache_tag) {
    using cache = typename decltype(cache_tag)::type;
    return kvreplay::detail::replay_guarded(*parsed.value, "t", [&](std::int64_t* at_line) {
      return kvreplay::detail::replay_manager<cache>(*parsed.value, "t", {}, at_line);
    });
  };
  EXPECT_EQ(guarded(std::type_identity<create_throws>{}).error, where + "out of memory (std::bad_alloc)");
  EXPECT_EQ(guarded(std::type_identity<admission_throws>{}).error,
            "t:6: out of memory (std::bad_alloc) replaying this op");
#endif
}

// The case from the issue, on the real cache: 2^24 blocks of 4096 tokens with prefix caching. Not under ASan (its
// allocator reports a huge allocation instead of throwing) nor without exceptions (nothing could catch it).
TEST(ReplayErrors, HugeCacheWithinTheParserLimitsIsReportedNeverAborts) {
#if defined(__SANITIZE_ADDRESS__) || !KVPAGER_HAS_EXCEPTIONS
  GTEST_SKIP() << "needs a throwing allocator that is not ASan's";
#else
  const std::string text = read_file(data_dir + "/bad/cache_too_large.kvtrace");
  const auto parsed = kvreplay::parse_kvtrace(text, "big");
  ASSERT_TRUE(parsed.value.has_value()) << parsed.error;
  const auto r = kvreplay::replay(*parsed.value, "big");
  // Any answer of create is handled: an error (errc::out_of_memory) or std::bad_alloc, both reported at the
  // num_blocks line; or a cache, where create takes memory only as it is used, which then replays the (no) ops.
  if (r.error.empty()) {
    EXPECT_EQ(r.result["final_usage"], 0.0);
  } else {
    EXPECT_EQ(r.error.rfind("big:5: cannot create the cache for num_blocks 16777216, block_size 4096, prefix caching on: ", 0), 0U)
        << r.error;
  }
#endif
}

namespace {
/// The replay of `text` (named "t"): its result, or its error when it has one.
kvreplay::replay_result replay_text(const std::string& text, kvreplay::replay_limits limits = {}) {
  const auto parsed = kvreplay::parse_kvtrace(text, "t");
  if (!parsed.value) return {kvreplay::json::object(), parsed.error};
  return kvreplay::replay(*parsed.value, "t", limits);
}
}  // namespace

// Issue 9 item 12: the `run 0` guard against requests that never finish (max_new 0) looked only at the waiting and
// running queues, so a request left in the swapped queue ran for 16.7 M steps. The guard now covers every request
// the scheduler holds, whichever queue it is in.
TEST(ReplayErrors, RunZeroWithAnUnlimitedRequestInAnyQueueIsAnError) {
  const std::string swapped = read_file(data_dir + "/bad/run0_swapped.kvtrace");
  ASSERT_FALSE(swapped.empty());
  const std::string before_run0 = swapped.substr(0, swapped.rfind("run 0"));
  // Before the `run 0`, request 2 (max_new 0) is only in the swapped queue: swapped out, not back, not finished.
  const auto prefix = replay_text(before_run0);
  ASSERT_EQ(prefix.error, "");
  EXPECT_EQ(prefix.result["swap_outs"], 1);
  EXPECT_EQ(prefix.result["swap_ins"], 0);
  EXPECT_EQ(prefix.result["finished"], 1);
  EXPECT_EQ(replay_text(swapped).error, "t:13: 'run 0' with request 2 whose max_new is 0 never ends");
  // In the waiting queue after a recompute preemption, and in the running queue.
  std::string recompute = before_run0;
  recompute.replace(recompute.find("param preemption swap"), 21, "param preemption recompute");
  const auto preempted = replay_text(recompute);
  ASSERT_EQ(preempted.error, "");
  EXPECT_EQ(preempted.result["preemptions"], 1);
  EXPECT_EQ(replay_text(recompute + "run 0\n").error, "t:13: 'run 0' with request 2 whose max_new is 0 never ends");
  const std::string running = manager_head + "req 1 5 0 9:10\nrun 3\nrun 0\n";
  EXPECT_EQ(replay_text(running).error, "t:7: 'run 0' with request 1 whose max_new is 0 never ends");
  // Finite requests in the same queues finish: the guard rejects only what cannot end.
  std::string finite = swapped;
  finite.replace(finite.find("req 2 2 0 2:4"), 13, "req 2 2 8 2:4");
  const auto done = replay_text(finite);
  ASSERT_EQ(done.error, "");
  EXPECT_EQ(done.result["finished"], 2);
  EXPECT_EQ(done.result["swap_ins"], 1);
  EXPECT_FALSE(done.result["run_stalled"].get<bool>());
}

// Untrusted traces can still ask for very long replays with finite requests (max_new 2^30, decode 2^30): the
// safety limits bound every loop that such a trace can lengthen (run steps, and tokens from req, fork, decode and
// run), each reported at the op's line; generous limits change no count.
TEST(ReplayLimits, StepAndTokenLimitsBoundEveryLoop) {
  const std::string head = manager_head + "param block_size 4096\nparam enable_caching 0\n";
  EXPECT_EQ(replay_text(head + "req 1 5 1073741824 9:10\nrun 0\n", {100, 0}).error,
            "t:8: step limit reached (100 steps)");
  EXPECT_EQ(replay_text(head + "req 1 5 1073741824 9:10\nrun 0\n", {0, 500}).error,
            "t:8: token limit reached (500 tokens)");
  EXPECT_EQ(replay_text(head + "req 1 5 0 9:10\nadmit 1\ndecode 1 1073741824\n", {0, 500}).error,
            "t:9: token limit reached (500 tokens)");
  EXPECT_EQ(replay_text(head + "req 1 5 0 9:300\nreq 2 5 0 9:300\n", {0, 500}).error,
            "t:8: token limit reached (500 tokens)");
  EXPECT_EQ(replay_text(head + "req 1 5 0 9:200\nadmit 1\nfork 1 2 7\nfork 1 3 7\n", {0, 500}).error,
            "t:10: token limit reached (500 tokens)");
  const std::string c = read_file(data_dir + "/traces/C_decode_growth.kvtrace");
  const auto limited = replay_text(c, {1920, 256 * (128 + 1920)});
  ASSERT_EQ(limited.error, "") << "limits equal to what trace C needs";
  EXPECT_EQ(limited.result["steps"], 1920);
  EXPECT_EQ(replay_text(c, {1919, 0}).error.rfind("t:", 0), 0U);
}

// Issue 9 "Also": a directory given as the trace read as an empty file ("empty trace"). Only a regular file is a
// trace: a directory, a FIFO (which would block) or a device (/dev/zero never ends) is an I/O error.
TEST(ReplayFiles, PathThatIsNotARegularFileIsAnIoError) {
  const auto dir = kvreplay::read_trace_file(data_dir);
  EXPECT_FALSE(dir.text.has_value());
  EXPECT_EQ(dir.error, "cannot read " + data_dir + ": is a directory");
  const auto missing = kvreplay::read_trace_file(data_dir + "/no_such.kvtrace");
  EXPECT_FALSE(missing.text.has_value());
  EXPECT_EQ(missing.error.rfind("cannot read " + data_dir + "/no_such.kvtrace: ", 0), 0U) << missing.error;
  for (const std::string dev : {"/dev/null", "/dev/zero"}) {
    if (!std::filesystem::exists(dev)) continue;
    const auto r = kvreplay::read_trace_file(dev);
    EXPECT_FALSE(r.text.has_value()) << dev;
    EXPECT_EQ(r.error, "cannot read " + dev + ": not a regular file");
  }
  const auto tmp = std::filesystem::temp_directory_path() / ("kvpager_replay_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string fifo = (tmp / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto f = kvreplay::read_trace_file(fifo);  // returns at once: a FIFO is not opened
  EXPECT_EQ(f.error, "cannot read " + fifo + ": not a regular file");
  const std::string trace = data_dir + "/traces/C_decode_growth.kvtrace";
  std::filesystem::create_symlink(trace, tmp / "link.kvtrace");
  const auto linked = kvreplay::read_trace_file((tmp / "link.kvtrace").string());
  ASSERT_TRUE(linked.text.has_value()) << linked.error;
  EXPECT_EQ(*linked.text, read_file(trace));
  std::filesystem::remove_all(tmp);
}

// A fork the cache refuses still defines the child, as the parser does: later ops on it are no-ops (as on a failed
// admission), never a lookup of a request the replayer does not know (std::out_of_range before).
TEST(ReplayErrors, RefusedForkLeavesTheChildAFailedRequest) {
  const std::string text = manager_head + "req 1 5 4 9:10\nadmit 1\nfork 1 2 7\nadmit 2\ndecode 2 3\nfork 2 3 8\n"
                                          "finish 2\nfinish 1\nrun 0\n";
  const auto parsed = kvreplay::parse_kvtrace(text, "t");
  ASSERT_TRUE(parsed.value.has_value()) << parsed.error;
  const auto r = kvreplay::detail::replay_manager<fork_fails>(*parsed.value, "t", {});
  EXPECT_EQ(r.error, "t:10: fork: request 2 is not live (admit it first)") << "the failed child is not live";
  const auto parsed2 = kvreplay::parse_kvtrace(manager_head + "req 1 5 4 9:10\nadmit 1\nfork 1 2 7\nadmit 2\n"
                                                              "decode 2 3\nfinish 2\nfinish 1\nrun 0\n", "t");
  ASSERT_TRUE(parsed2.value.has_value()) << parsed2.error;
  const auto ok = kvreplay::detail::replay_manager<fork_fails>(*parsed2.value, "t", {});
  ASSERT_EQ(ok.error, "");
  EXPECT_EQ(ok.result["forks"], 0);
  EXPECT_EQ(ok.result["admit_fail"], 0) << "admit of the failed child is a no-op";
  EXPECT_EQ(ok.result["steps"], 0) << "run does not queue it";
  EXPECT_EQ(ok.result["final_usage"], 0.0);
}
