// SPDX-License-Identifier: Apache-2.0
// Writes the Prometheus text and the JSON of a snapshot taken after a real serving run (tests/monitor/scenario.hpp)
// into <dir>/metrics.prom and <dir>/metrics.json, for check_prometheus.py, which parses the text with the
// Prometheus client's parser and checks every value against the JSON. Exits non-zero if the run did not give
// every metric family a non-trivial value (the check would then prove little).
#include <kvpager/monitor/group_metrics.hpp>
#include <kvpager/monitor/json.hpp>
#include <kvpager/monitor/metrics.hpp>
#include <kvpager/monitor/prometheus.hpp>
#include <kvpager/monitor/tier_metrics.hpp>
#include <kvpager/tier/arc_tier.hpp>
#include <kvpager/tier/host_tier.hpp>

#include <array>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <kvpager/cache/hybrid_kv_cache.hpp>
#include <nlohmann/json.hpp>

#include "monitor/scenario.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <output dir>\n", argv[0]);
    return 2;
  }
  using namespace kvtest_monitor;
  cache_t cache = make_cache();
  sched_t s(cache, sched_config());
  run(cache, s, 40, [](int) {});
  const kvpager::metrics_snapshot m =
      kvpager::take_snapshot(cache, s, kvpager::kv_bytes_per_block(geometry, num_layers));

  const struct {
    const char* what;
    bool ok;
  } checks[] = {
      {"usage strictly between 0 and 1", m.kv_cache_usage > 0 && m.kv_cache_usage < 1},
      {"running", m.running > 0},
      {"waiting", m.waiting > 0},
      {"swap-outs and swap-ins", m.swap_outs > 0 && m.swap_ins > 0},
      {"swapped bytes", m.swapped_out_bytes > 0 && m.swapped_in_bytes > 0},
      {"preemptions of both modes", m.preemptions_swap > 0 && m.preemptions_recompute > 0},
      {"shared blocks", m.shared_blocks > 0 && m.sharing_ratio > 0},
      {"prefix hits", m.prefix_hits > 0 && m.prefix_hit_rate > 0 && m.prefix_hit_rate < 1},
      {"evictions", m.evictions > 0},
      {"internal waste", m.internal_waste_tokens > 0 && m.internal_waste_bytes > 0},
      {"admission answers of each kind", m.admission_ok > 0 && m.admission_later > 0 && m.admission_never > 0},
  };
  int failed = 0;
  for (const auto& c : checks) {
    if (!c.ok) {
      std::fprintf(stderr, "expose_metrics: the run gave no %s\n", c.what);
      ++failed;
    }
  }

  std::string prom;
  kvpager::write_prometheus(prom, m);
  kvpager::metrics_json_writer json(2);
  const std::string& text = json.write(m);
  const std::string dir = argv[1];
  std::ofstream(dir + "/metrics.prom", std::ios::binary) << prom;
  std::ofstream(dir + "/metrics.json", std::ios::binary) << text << '\n';
  std::printf("%s\n%s\n", prom.c_str(), text.c_str());

  // A cache with KV cache groups, [full, sliding_window 16] over blocks of 8 tokens: sequences decode past the
  // window, one is freed and asked again (prefix hits): groups.prom (the per-group families) and groups.json.
  using hybrid = kvpager::hybrid_kv_cache<kvpager::any_group_kind>;
  const std::vector<kvpager::any_group_kind> kinds{kvpager::full_attention{}, kvpager::sliding_window{16}};
  auto made = hybrid::create({8, 1 + 200, 1, 0}, kinds);
  if (!made) return 1;
  hybrid& h = *made;
  std::vector<kvpager::token_id> prompt(40);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<kvpager::token_id>(i);
  for (kvpager::seq_id id = 0; id < 3; ++id) {
    prompt[0] = static_cast<kvpager::token_id>(100 + id);
    if (!h.add_sequence(id, prompt)) return 1;
  }
  for (int t = 0; t < 30; ++t) {
    h.begin_step();
    for (kvpager::seq_id id = 0; id < 3; ++id)
      if (!h.append_token(id, static_cast<kvpager::token_id>(t))) return 1;
  }
  h.begin_step();
  if (!h.free_sequence(0)) return 1;
  prompt[0] = 100;
  if (!h.add_sequence(9, prompt)) return 1;
  std::array<kvpager::group_metrics, 4> groups{};
  const std::size_t n = kvpager::take_group_snapshots(h, groups);
  std::string gprom;
  kvpager::append_group_prometheus(gprom, std::span<const kvpager::group_metrics>(groups).first(n));
  nlohmann::ordered_json gj = nlohmann::ordered_json::array();
  for (std::size_t g = 0; g < n; ++g)
    gj.push_back({{"group", groups[g].group}, {"kind", groups[g].kind}, {"usage", groups[g].usage},
                  {"blocks", groups[g].blocks}, {"peak_blocks", groups[g].peak_blocks},
                  {"table_entries", groups[g].table_entries}, {"released_blocks", groups[g].released_blocks},
                  {"hit_blocks", groups[g].hit_blocks}});
  std::ofstream(dir + "/groups.prom", std::ios::binary) << gprom;
  std::ofstream(dir + "/groups.json", std::ios::binary) << gj.dump(2) << '\n';
  std::printf("%s\n", gprom.c_str());
  if (n != 2 || groups[1].released_blocks == 0 || groups[1].hit_blocks == 0 || groups[0].usage <= 0) {
    std::fprintf(stderr, "expose_metrics: the hybrid run gave no released blocks, hits or usage\n");
    ++failed;
  }

  // A host tier (ARC, 4 blocks, priority floor 1, exclusive) through stores that evict, fail and are refused, lookups
  // that hit, miss and find a store pending, and loads: tier.prom and tier.json (its raw figures).
  auto tier_made = kvpager::host_tier<kvpager::arc_tier>::create({4, 1, 64000, 1, false});
  if (!tier_made) return 1;
  auto& tier = *tier_made;
  kvpager::tier_store_plan plan;
  using keys = std::vector<std::uint64_t>;
  if (!tier.prepare_store(keys{1, 2, 3, 4}, plan, {}, 1)) return 1;
  tier.complete_store(keys{1, 2, 3}, true);
  tier.complete_store(keys{4}, false);                                      // a failed store
  if (!tier.prepare_store(keys{9}, plan, {}, 0)) return 1;                  // below the priority floor
  (void)tier.lookup(1);                                                     // hit
  (void)tier.lookup(7);                                                     // miss
  if (!tier.prepare_store(keys{5, 6}, plan, {}, 2) || plan.evicted != keys{1}) return 1;  // evicts block 1
  (void)tier.lookup(5);                                                     // pending
  std::vector<kvpager::block_id> hb(1);
  if (!tier.prepare_load(keys{2}, hb)) return 1;
  const bool refused = !tier.prepare_store(keys{10, 11, 12, 13}, plan, {}, 2);  // only block 3 is evictable
  if (!tier.complete_load(keys{2})) return 1;                                // exclusive: 2 moves up
  if (!tier.prepare_load(keys{3}, hb) || !tier.fail_load(keys{3})) return 1;  // a failed load
  const kvpager::host_tier_stats ts = tier.stats();
  std::string tprom;
  constexpr std::int32_t tier_block_size = 16;
  constexpr std::int64_t tier_block_bytes = 8 << 20;
  kvpager::append_tier_prometheus(tprom, ts, tier_block_size, tier_block_bytes);
  const nlohmann::ordered_json tj = {
      {"block_size", tier_block_size}, {"bytes_per_block", tier_block_bytes}, {"num_blocks", ts.num_blocks},
      {"held", ts.held}, {"writing", ts.writing}, {"reading", ts.reading}, {"lookups", ts.lookups},
      {"hits", ts.hits}, {"pending_hits", ts.pending_hits}, {"stored", ts.stored},
      {"failed_stores", ts.failed_stores}, {"loads", ts.loads}, {"evicted", ts.evicted},
      {"refused_stores", ts.refused_stores}, {"below_priority", ts.below_priority}, {"moved_up", ts.moved_up},
      {"failed_loads", ts.failed_loads}};
  std::ofstream(dir + "/tier.prom", std::ios::binary) << tprom;
  std::ofstream(dir + "/tier.json", std::ios::binary) << tj.dump(2) << '\n';
  std::printf("%s\n", tprom.c_str());
  if (!refused || ts.hits == 0 || ts.pending_hits == 0 || ts.evicted == 0 || ts.failed_stores == 0 ||
      ts.below_priority == 0 || ts.loads == 0 || ts.moved_up == 0 || ts.writing == 0 || ts.failed_loads == 0) {
    std::fprintf(stderr, "expose_metrics: the tier run left a figure at zero: %s\n", tj.dump().c_str());
    ++failed;
  }
  return failed == 0 ? 0 : 1;
}
