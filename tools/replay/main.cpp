// SPDX-License-Identifier: Apache-2.0
// kvpager-replay: replays kvtrace files through kvpager and prints one JSON document (docs/KVTRACE.md).
//
//   kvpager-replay [--repeat N] [--max-steps N] [--max-tokens N] FILE...
//
// Each file is replayed N times (default 1); counts must agree between repeats, elapsed_s is the fastest run and
// elapsed_s_all lists every run. --max-steps and --max-tokens bound the replay of untrusted traces (replay_limits;
// default unlimited). Exit status: 0 on success; 1 when a trace cannot be replayed: a trace error, a limit reached,
// a cache the params cannot create or memory exhausted (each reported as FILE:LINE: message), or an internal
// error (reported); 2 on a usage or I/O error (a path that is not a readable regular file). No input aborts.
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "kvtrace.hpp"
#include "replayer.hpp"

namespace {

int usage(const char* why) {
  if (why != nullptr) std::fprintf(stderr, "kvpager-replay: %s\n", why);
  std::fprintf(stderr, "usage: kvpager-replay [--repeat N] [--max-steps N] [--max-tokens N] FILE...\n");
  return 2;
}

/// A whole decimal number in [lo, hi].
template <class T>
bool parse_count(std::string_view v, T lo, T hi, T& out) {
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc{} && p == v.data() + v.size() && out >= lo && out <= hi;
}

/// Removes the timing keys, leaving what must be identical between repeats.
kvreplay::json counts_only(kvreplay::json r) {
  for (const char* k : {"elapsed_s", "ns_per_block_op", "block_ops_per_s", "step_ms_mean", "step_ms_p50", "step_ms_p99"})
    r.erase(k);
  return r;
}

/// The tool without the last-resort handler (main); `current` names the file being read or replayed.
int run(int argc, char** argv, std::string& current) {
  int repeat = 1;
  kvreplay::replay_limits limits;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(nullptr);
      return 0;
    }
    if (a == "--repeat" || a == "--max-steps" || a == "--max-tokens") {
      if (i + 1 >= argc) return usage((a + " needs a number").c_str());
      const std::string_view v = argv[++i];
      if (a == "--repeat") {
        if (!parse_count(v, 1, 1000, repeat)) return usage("--repeat must be a number in [1, 1000]");
      } else if (!parse_count<std::int64_t>(v, 0, INT64_MAX, a == "--max-steps" ? limits.max_steps : limits.max_tokens)) {
        return usage((a + " must be a non-negative number (0 = unlimited)").c_str());
      }
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
    current = file;
    const kvreplay::read_result read = kvreplay::read_trace_file(file);
    if (!read.text) {
      std::fprintf(stderr, "kvpager-replay: %s\n", read.error.c_str());
      return 2;
    }
    const kvreplay::parse_result parsed = kvreplay::parse_kvtrace(*read.text, file);
    if (!parsed.value) {
      std::fprintf(stderr, "kvpager-replay: %s\n", parsed.error.c_str());
      return 1;
    }
    const kvreplay::trace& t = *parsed.value;
    kvreplay::json best;
    std::vector<double> all;
    for (int k = 0; k < repeat; ++k) {
      kvreplay::replay_result r = kvreplay::replay(t, file, limits);
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
    kvreplay::json w = kvreplay::workload_entry(t, std::move(best));
    if (repeat > 1) w["elapsed_s_all"] = all;
    doc["workloads"].push_back(std::move(w));
  }
  current.clear();
  std::cout << doc.dump(1) << '\n';
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
#if KVPAGER_HAS_EXCEPTIONS
  // The parser and replayer report every bad input themselves; this is the backstop that keeps any escape (memory
  // exhausted outside a replay, a JSON error) a reported failure instead of an abort.
  std::string current;
  try {
    return run(argc, argv, current);
  } catch (const std::bad_alloc&) {  // printed without allocating
    std::fprintf(stderr, "kvpager-replay: %s%sout of memory\n", current.c_str(), current.empty() ? "" : ": ");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvpager-replay: %s%sinternal error: %s\n", current.c_str(), current.empty() ? "" : ": ",
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "kvpager-replay: %s%sinternal error\n", current.c_str(), current.empty() ? "" : ": ");
  }
  return 1;
#else
  std::string current;
  return run(argc, argv, current);
#endif
}
