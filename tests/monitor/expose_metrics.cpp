// SPDX-License-Identifier: Apache-2.0
// Writes the Prometheus text and the JSON of a snapshot taken after a real serving run (tests/monitor/scenario.hpp)
// into <dir>/metrics.prom and <dir>/metrics.json, for check_prometheus.py, which parses the text with the
// Prometheus client's parser and checks every value against the JSON. Exits non-zero if the run did not give
// every metric family a non-trivial value (the check would then prove little).
#include <kvpager/monitor/json.hpp>
#include <kvpager/monitor/metrics.hpp>
#include <kvpager/monitor/prometheus.hpp>

#include <cstdio>
#include <fstream>
#include <string>

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
  return failed == 0 ? 0 : 1;
}
