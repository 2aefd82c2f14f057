// kvpager-replay: replays kvtrace files through kvpager and prints one JSON document (docs/KVTRACE.md).
//
//   kvpager-replay [--repeat N] FILE...
//
// Each file is replayed N times (default 1); counts must agree between repeats, elapsed_s is the fastest run and
// elapsed_s_all lists every run. Exit status: 0 on success, 1 on a trace error (reported as FILE:LINE: message),
// 2 on a usage or I/O error.
#include <charconv>
#include <cstdio>
#include <string_view>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kvtrace.hpp"
#include "replayer.hpp"

namespace {

int usage(const char* why) {
  if (why != nullptr) std::fprintf(stderr, "kvpager-replay: %s\n", why);
  std::fprintf(stderr, "usage: kvpager-replay [--repeat N] FILE...\n");
  return 2;
}

/// Removes the timing keys, leaving what must be identical between repeats.
kvreplay::json counts_only(kvreplay::json r) {
  for (const char* k : {"elapsed_s", "ns_per_block_op", "block_ops_per_s", "step_ms_mean", "step_ms_p50", "step_ms_p99"})
    r.erase(k);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int repeat = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(nullptr);
      return 0;
    }
    if (a == "--repeat") {
      if (i + 1 >= argc) return usage("--repeat needs a number");
      const std::string_view v = argv[++i];
      const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), repeat);
      if (ec != std::errc{} || p != v.data() + v.size() || repeat < 1 || repeat > 1000)
        return usage("--repeat must be a number in [1, 1000]");
    } else if (!a.empty() && a[0] == '-') {
      return usage(("unknown option " + a).c_str());
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) return usage("no trace file given");

  kvreplay::json doc;
  doc["workloads"] = kvreplay::json::array();
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "kvpager-replay: cannot read %s\n", file.c_str());
      return 2;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const kvreplay::parse_result parsed = kvreplay::parse_kvtrace(text, file);
    if (!parsed.value) {
      std::fprintf(stderr, "kvpager-replay: %s\n", parsed.error.c_str());
      return 1;
    }
    const kvreplay::trace& t = *parsed.value;
    kvreplay::json best;
    std::vector<double> all;
    for (int k = 0; k < repeat; ++k) {
      kvreplay::replay_result r = kvreplay::replay(t, file);
      if (!r.error.empty()) {
        std::fprintf(stderr, "kvpager-replay: %s\n", r.error.c_str());
        return 1;
      }
      const double e = r.result["elapsed_s"].get<double>();
      all.push_back(e);
      if (k == 0) {
        best = std::move(r.result);
      } else {
        if (counts_only(r.result) != counts_only(best)) {
          std::fprintf(stderr, "kvpager-replay: %s: counts differ between repeats\n", file.c_str());
          return 1;
        }
        if (e < best["elapsed_s"].get<double>()) best = std::move(r.result);
      }
    }
    kvreplay::json w;
    w["workload"] = t.workload;
    w["level"] = t.level;
    w["params"] = kvreplay::json::object();
    for (const auto& [key, value] : t.raw_params) {
      std::int64_t v = 0;
      if (kvreplay::detail::parse_uint(value, v)) {
        w["params"][key] = v;
      } else {
        w["params"][key] = value;
      }
    }
    w["ops"] = t.ops.size();
    w["result"] = std::move(best);
    if (repeat > 1) w["elapsed_s_all"] = all;
    doc["workloads"].push_back(std::move(w));
  }
  std::cout << doc.dump(1) << '\n';
  return 0;
}
