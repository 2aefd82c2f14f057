// kvpager-replay's engine: the four public traces give vLLM's exact counts; malformed traces give an error naming
// the line; randomly mutated traces never crash or hang.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
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
      {"kvtrace 1\nlevel pool\nparam num_blocks 8\nparam block_size 12\nalloc 1 1\n", "t.kvtrace:5: block_size must be"},
      {"kvtrace 1\nlevel pool\nparam num_blocks 999999999999\nalloc 1 1\n", "t.kvtrace:4: num_blocks must be"},
      {"kvtrace 1\nlevel pool\nparam num_blocks 8\nalloc 1", "t.kvtrace:4: 'alloc' takes"},  // truncated last line
      {manager_head + "param preemption often\n", "t.kvtrace:5: 'param preemption' must be"},
      {manager_head + "param preemption swap\nreq 1 5 4 9:10\n", "t.kvtrace:6: 'param preemption swap|hybrid' needs"},
      {manager_head + "param watermark_permille 1001\nreq 1 5 4 9:10\n", "t.kvtrace:6: watermark_permille must be"},
      {manager_head + "req 1 5 4 9:10\nfork 1 2\n", "t.kvtrace:6: 'fork' takes"},
      {manager_head + "req 1 5 4 9:10\nfork 3 2 7\n", "t.kvtrace:6: request 3 is not defined"},
      {manager_head + "req 1 5 4 9:10\nfork 1 1 7\n", "t.kvtrace:6: request 1 is defined twice"},
      {manager_head + "req 1 5 4 9:10\nfork 1 2 7\n", "t.kvtrace:6: fork: request 1 is not live"},
      {std::string("kvtrace 1\nlevel pool\nparam num_blocks 8\nalloc 1") + std::string(1, '\0') + " 1\n",
       "t.kvtrace:4: NUL byte"},
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
/// A random edit: drop, duplicate or swap a line, replace a field with junk, truncate, or insert bytes.
std::string mutate(std::string text, std::mt19937_64& rng) {
  static const std::vector<std::string> junk = {"-1", "0", "99999999999999999999", "x", ":", "1:", ":5", "1:0",
                                                "#", "\t", "4294967296", "run", "req", "free", "alloc", "admit 1",
                                                "decode 1 1000000", "9:16777216", "param", "level", "kvtrace 1", "fork 1 9 3",
                                                "param preemption hybrid", "param num_host_blocks 8"};
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
      ASSERT_EQ(parsed.error.rfind("fuzz:", 0), 0U) << parsed.error;
      continue;
    }
    ++parsed_ok;
    const auto r = kvreplay::replay(*parsed.value, "fuzz", kvreplay::replay_limits{20000});
    if (r.error.empty()) ++replayed_ok;
  }
  EXPECT_GT(parsed_ok, 2000);
  EXPECT_GT(replayed_ok, 1500);
}
