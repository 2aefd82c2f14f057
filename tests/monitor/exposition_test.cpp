// SPDX-License-Identifier: Apache-2.0
// The Prometheus text (format 0.0.4) and the JSON of a snapshot: names, HELP and TYPE lines, the size bound for
// any values, the buffer check, and JSON equal to the snapshot. The real parser's check is
// monitor.prometheus_text_parses_with_the_prometheus_client (check_prometheus.py).
#include <kvpager/kvpager.hpp>
#include <kvpager/monitor/prometheus.hpp>
#include <kvpager/monitor/json.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "monitor/scenario.hpp"

using namespace kvpager;

namespace {
metrics_snapshot real_snapshot() {
  using namespace kvtest_monitor;
  cache_t cache = make_cache();
  sched_t s(cache, sched_config());
  run(cache, s, 40, [](int) {});
  return take_snapshot(cache, s, kv_bytes_per_block(geometry, num_layers));
}

/// Every field at an extreme: the longest numbers there are.
metrics_snapshot extreme_snapshot() {
  metrics_snapshot m;
  constexpr std::int64_t big = std::numeric_limits<std::int64_t>::min();
  constexpr std::int32_t big32 = std::numeric_limits<std::int32_t>::min();
  m.block_size = m.usable_blocks = m.used_blocks = m.free_blocks = m.evictable_blocks = m.cached_blocks = big32;
  m.running = m.waiting = m.swapped = m.shared_blocks = m.referenced_blocks = m.loading = m.tier_in_flight = big32;
  for (std::int64_t* p : {&m.bytes_per_block, &m.swap_outs, &m.swap_ins, &m.swapped_out_blocks, &m.swapped_in_blocks,
                          &m.swapped_out_bytes, &m.swapped_in_bytes, &m.preemptions_recompute, &m.preemptions_swap,
                          &m.swap_fallback_recompute, &m.logical_blocks, &m.prefix_queries, &m.prefix_hits,
                          &m.resumed_prefix_queries, &m.resumed_prefix_hits, &m.evictions, &m.internal_waste_tokens,
                          &m.internal_waste_bytes, &m.admission_ok, &m.admission_later, &m.admission_never,
                          &m.admitted, &m.steps, &m.prefix_host_hits, &m.tier_failed_loads, &m.tier_failed_stores,
                          &m.tier_load_timeouts})
    *p = big;
  m.preemptions_swap = 0;  // preemptions() must not overflow
  m.kv_cache_usage = -2.2250738585072014e-308;
  m.shared_fraction = -1.2345678901234567e-300;
  m.sharing_ratio = std::numeric_limits<double>::quiet_NaN();
  m.prefix_hit_rate = -std::numeric_limits<double>::infinity();
  return m;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}
}  // namespace

TEST(Prometheus, FamiliesHaveHelpTypeAndVllmNames) {
  std::string text;
  write_prometheus(text, real_snapshot());
  const auto lines = lines_of(text);
  std::size_t families = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("# HELP ", 0) != 0) continue;
    ++families;
    const std::string name = lines[i].substr(7, lines[i].find(' ', 7) - 7);
    ASSERT_LT(i + 2, lines.size());
    EXPECT_EQ(lines[i + 1].rfind("# TYPE " + name + " ", 0), 0U) << name;
    const std::string type = lines[i + 1].substr(8 + name.size());
    EXPECT_TRUE(type == "gauge" || type == "counter") << name;
    EXPECT_EQ(type == "counter", name.size() > 6 && name.ends_with("_total")) << name << ": counters end in _total";
    EXPECT_EQ(name.rfind("kvpager:", 0), 0U) << name;
    EXPECT_EQ(lines[i + 2].rfind(name, 0), 0U) << "a sample of " << name << " follows";
  }
  EXPECT_EQ(families, prometheus_num_families());
  for (const char* vllm : {"kvpager:kv_cache_usage_perc", "kvpager:num_requests_running", "kvpager:num_requests_waiting",
                           "kvpager:num_preemptions_total", "kvpager:prefix_cache_queries_total",
                           "kvpager:prefix_cache_hits_total"})
    EXPECT_NE(text.find(std::string("\n# TYPE ") + vllm + " "), std::string::npos) << vllm;
  EXPECT_TRUE(text.ends_with("\n"));
}

TEST(Prometheus, ValuesAreWrittenExactly) {
  metrics_snapshot m;
  m.kv_cache_usage = 0.1;
  m.waiting = 43;
  m.preemptions_recompute = 2;
  m.preemptions_swap = 3;
  m.prefix_hit_rate = std::numeric_limits<double>::quiet_NaN();
  m.sharing_ratio = std::numeric_limits<double>::infinity();
  std::string text;
  write_prometheus(text, m);
  EXPECT_NE(text.find("\nkvpager:kv_cache_usage_perc 0.1\n"), std::string::npos);
  EXPECT_NE(text.find("\nkvpager:num_requests_waiting 43\n"), std::string::npos);
  EXPECT_NE(text.find("\nkvpager:num_preemptions_total 5\n"), std::string::npos);
  EXPECT_NE(text.find("\nkvpager:preemptions_total{mode=\"swap\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("\nkvpager:preemptions_total{mode=\"recompute\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("\nkvpager:kv_cache_sharing_ratio +Inf\n"), std::string::npos);
  EXPECT_EQ(text.find("\nkvpager:prefix_cache_hit_rate"), std::string::npos) << "not exported: a rate of counters";
}

TEST(Prometheus, TheSizeBoundHoldsForAnyValues) {
  std::string text;
  write_prometheus(text, extreme_snapshot());
  EXPECT_LE(text.size(), prometheus_max_size());
  EXPECT_NE(text.find(" NaN\n"), std::string::npos);
  EXPECT_NE(text.find(" -9223372036854775808\n"), std::string::npos);
  // The string keeps its capacity: a later, shorter text reuses it.
  const auto* data = text.data();
  write_prometheus(text, metrics_snapshot{});
  EXPECT_EQ(text.data(), data);
  EXPECT_LT(text.size(), prometheus_max_size());
}

TEST(Prometheus, SpanWriterChecksTheBufferAndWritesTheSameText) {
  const metrics_snapshot m = real_snapshot();
  std::vector<char> small(prometheus_max_size() - 1, 'x');
  const auto r = write_prometheus(std::span<char>(small), m);
  EXPECT_EQ(r.error().code(), errc::buffer_too_small);
  EXPECT_EQ(r.error().detail(), static_cast<std::int64_t>(prometheus_max_size()));
  EXPECT_EQ(small, std::vector<char>(prometheus_max_size() - 1, 'x')) << "nothing written";
  std::vector<char> buf(prometheus_max_size());
  const auto n = write_prometheus(std::span<char>(buf), m);
  ASSERT_TRUE(n);
  std::string text;
  write_prometheus(text, m);
  EXPECT_EQ(std::string(buf.data(), *n), text);
}

TEST(Json, WriterTextIsTheSnapshot) {
  const metrics_snapshot m = real_snapshot();
  metrics_json_writer w;
  const nlohmann::json parsed = nlohmann::json::parse(w.write(m));
  const nlohmann::json direct = m;  // to_json
  EXPECT_EQ(parsed, direct);
  EXPECT_EQ(parsed, w.document());
  EXPECT_EQ(parsed["kv_cache"]["usage"].get<double>(), m.kv_cache_usage);
  EXPECT_EQ(parsed["requests"]["waiting"].get<std::int64_t>(), m.waiting);
  EXPECT_EQ(parsed["preemptions"]["total"].get<std::int64_t>(), m.preemptions());
  EXPECT_EQ(parsed["swaps"]["out_bytes"].get<std::int64_t>(), m.swapped_out_bytes);
  EXPECT_EQ(parsed["internal_waste"]["tokens"].get<std::int64_t>(), m.internal_waste_tokens);
  EXPECT_EQ(parsed["admission"]["later"].get<std::int64_t>(), m.admission_later);
  EXPECT_EQ(parsed["steps"].get<std::int64_t>(), 40);
  // A second snapshot through the same writer: the numbers change, the keys do not.
  metrics_snapshot other = m;
  other.waiting = 7;
  other.kv_cache_usage = 0.25;
  const nlohmann::json again = nlohmann::json::parse(w.write(other));
  EXPECT_EQ(again["requests"]["waiting"].get<std::int64_t>(), 7);
  EXPECT_EQ(again["kv_cache"]["usage"].get<double>(), 0.25);
  EXPECT_EQ(again.size(), parsed.size());
}

TEST(Json, PrettyTextAndTheSizeReserve) {
  metrics_json_writer pretty(2);
  const std::string& text = pretty.write(real_snapshot());
  EXPECT_NE(text.find("\n  \"kv_cache\": {\n    \"block_bytes\": 262144,"), std::string::npos) << text;
  // The reserve covers the longest numbers: writing them does not move the text.
  metrics_json_writer w;
  const char* data = w.text().data();
  metrics_snapshot m = extreme_snapshot();
  m.sharing_ratio = 0.5;  // JSON has no NaN (nlohmann writes null)
  m.prefix_hit_rate = -1.2345678901234567e-300;
  const std::string& big = w.write(m);
  EXPECT_EQ(big.data(), data);
  EXPECT_NE(big.find("-9223372036854775808"), std::string::npos);
}

TEST(Prometheus, DocsListEveryFamily) {
  std::ifstream in(KVPAGER_DOCS_DIR "/monitoring.md");
  ASSERT_TRUE(in) << "docs/monitoring.md";
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (std::size_t i = 0; i < prometheus_num_families(); ++i) {
    const std::string row = "| `" + std::string(prometheus_family_name(i)) + "` |";
    EXPECT_NE(doc.find(row), std::string::npos) << prometheus_family_name(i) << " is missing from docs/monitoring.md";
  }
  EXPECT_TRUE(prometheus_family_name(prometheus_num_families()).empty());
}
