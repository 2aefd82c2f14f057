// SPDX-License-Identifier: Apache-2.0
#pragma once
// kvpager-sim's outputs: the side-by-side table, the JSON document, and the report directory (per-step CSV, an SVG
// chart written by hand, the Prometheus text of the last step).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrics.hpp"

namespace kvsim {

using ordered_json = nlohmann::ordered_json;

[[nodiscard]] inline ordered_json to_json(const run_summary& s) {
  ordered_json j;
  j["steps"] = s.steps;
  j["completed"] = s.completed;
  j["aborted"] = s.aborted;
  j["completed_per_step"] = s.completed_per_step;
  j["peak_batch"] = s.peak_batch;
  j["mean_batch"] = s.mean_batch;
  j["mean_kv_usage"] = s.mean_kv_usage;
  j["mean_token_share"] = s.mean_token_share;
  j["internal_waste"] = s.internal_waste;
  j["mean_external_fragmentation"] = s.mean_external_fragmentation;
  j["peak_external_fragmentation"] = s.peak_external_fragmentation;
  j["preemptions"] = s.preemptions;
  j["preemptions_swap"] = s.preemptions_swap;
  j["preemptions_recompute"] = s.preemptions_recompute;
  j["swap_outs"] = s.swap_outs;
  j["swap_ins"] = s.swap_ins;
  j["prefix_hit_rate"] = s.prefix_hit_rate;
  j["prefix_hit_tokens"] = s.prefix_hit_tokens;
  j["prefix_query_tokens"] = s.prefix_query_tokens;
  ordered_json h;
  for (std::size_t i = 0; i < s.health_steps.size(); ++i)
    h[kvpager::to_string(static_cast<kvpager::health_level>(i))] = s.health_steps[i];
  j["health_steps"] = h;
  j["wall_s"] = s.wall_s;
  return j;
}

/// The side-by-side table on stdout.
inline void print_table(const run_summary& p, const run_summary& c) {
  auto row = [](const char* name, const std::string& a, const std::string& b) {
    std::printf("  %-36s %24s %24s\n", name, a.c_str(), b.c_str());
  };
  auto num = [](double v, const char* fmt) {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  auto pct = [&](double v) { return num(100.0 * v, "%.1f%%"); };
  auto i64 = [](std::int64_t v) { return std::to_string(v); };
  row("", "paged", "contiguous");
  row("steps", i64(p.steps), i64(c.steps));
  row("requests completed", i64(p.completed), i64(c.completed));
  row("requests completed per step", num(p.completed_per_step, "%.4f"), num(c.completed_per_step, "%.4f"));
  row("batch size, peak", i64(p.peak_batch), i64(c.peak_batch));
  row("batch size, mean", num(p.mean_batch, "%.1f"), num(c.mean_batch, "%.1f"));
  row("KV allocated, mean (share of pool)", pct(p.mean_kv_usage), pct(c.mean_kv_usage));
  row("KV holding tokens, mean (share)", pct(p.mean_token_share), pct(c.mean_token_share));
  row("internal waste (allocated, empty)", pct(p.internal_waste), pct(c.internal_waste));
  row("external fragmentation, mean", pct(p.mean_external_fragmentation), pct(c.mean_external_fragmentation));
  row("external fragmentation, peak", pct(p.peak_external_fragmentation), pct(c.peak_external_fragmentation));
  row("preemptions (swap + recompute)", i64(p.preemptions_swap) + " + " + i64(p.preemptions_recompute),
      i64(c.preemptions));
  row("swaps (out / in)", i64(p.swap_outs) + " / " + i64(p.swap_ins), i64(c.swap_outs) + " / " + i64(c.swap_ins));
  row("prefix hit rate (tokens)", pct(p.prefix_hit_rate), pct(c.prefix_hit_rate));
  row("health levels seen", levels_seen(p), levels_seen(c));
  row("aborted or rejected", i64(p.aborted), i64(c.aborted));
  row("wall time", num(p.wall_s, "%.2f s"), num(c.wall_s, "%.2f s"));
}

/// One CSV row per sample and system: per step, except that a row of span k stands for k identical idle steps, and a
/// run longer than the history keeps only every stride-th sample (step_history; --json says the stride).
inline bool write_csv(const std::string& path, const std::vector<step_sample>& paged,
                      const std::vector<step_sample>& contiguous) {
  std::ofstream f(path);
  if (!f) return false;
  f << "system,step,running,waiting,swapped,batched_tokens,allocated_slots,stored_tokens,pool_slots,kv_usage,"
       "external_fragmentation,completed,preemptions,swaps,health,span\n";
  for (const auto* v : {&paged, &contiguous})
    for (const step_sample& x : *v) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "%s,%lld,%d,%d,%d,%lld,%lld,%lld,%lld,%.6f,%.6f,%lld,%lld,%lld,%s,%lld\n",
                    v == &paged ? "paged" : "contiguous", static_cast<long long>(x.step), x.running, x.waiting,
                    x.swapped, static_cast<long long>(x.batched_tokens), static_cast<long long>(x.allocated_slots),
                    static_cast<long long>(x.stored_tokens), static_cast<long long>(x.pool_slots), x.kv_usage,
                    x.external_fragmentation, static_cast<long long>(x.completed),
                    static_cast<long long>(x.preemptions), static_cast<long long>(x.swaps),
                    kvpager::to_string(x.health), static_cast<long long>(x.span));
      f << buf;
    }
  return static_cast<bool>(f);
}

/// Four panels over the steps (KV usage, running, waiting, cumulative swaps), paged against contiguous, as
/// hand-written SVG 1.1. At most ~800 points per line (evenly sampled steps).
inline bool write_svg(const std::string& path, const std::string& title, const std::vector<step_sample>& paged,
                      const std::vector<step_sample>& contiguous) {
  std::ofstream f(path);
  if (!f) return false;
  constexpr double width = 1100, panel_h = 150, left = 70, right = 20, top = 66, gap = 40;
  struct panel {
    const char* name;
    double (*get)(const step_sample&);
  };
  const panel panels[] = {
      {"KV usage (share of the pool allocated)", [](const step_sample& x) { return x.kv_usage; }},
      {"running requests (batch)", [](const step_sample& x) { return static_cast<double>(x.running); }},
      {"waiting requests", [](const step_sample& x) { return static_cast<double>(x.waiting); }},
      {"swap events (cumulative)", [](const step_sample& x) { return static_cast<double>(x.swaps); }},
  };
  const double height = top + 4 * (panel_h + gap) + 20;
  double steps = 1;  // the last step of either run (samples may span several steps, or be every k-th)
  for (const auto* v : {&paged, &contiguous})
    if (!v->empty()) steps = std::max(steps, static_cast<double>(v->back().step + v->back().span - 1));
  auto esc = [](std::string s) {
    std::string o;
    for (const char ch : s) {
      if (ch == '&') o += "&amp;";
      else if (ch == '<') o += "&lt;";
      else if (ch == '>') o += "&gt;";
      else o += ch;
    }
    return o;
  };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" height=\"%.0f\" "
                "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
                width, height, width, height);
  f << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" << buf;
  f << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  // The title on two lines, broken at the last ", " that leaves the first line within the chart's width (a long
  // trace path may still run past the edge of the second).
  const std::size_t fit = static_cast<std::size_t>((width - left - 10) / 7.6);
  std::string line1 = title, line2;
  if (title.size() > fit) {
    const std::size_t cut = title.rfind(", ", fit);
    if (cut != std::string::npos) {
      line1 = title.substr(0, cut + 1);
      line2 = title.substr(cut + 2);
    }
  }
  f << "<text x=\"" << left << "\" y=\"20\" font-size=\"14\">" << esc(line1) << "</text>\n";
  if (!line2.empty()) f << "<text x=\"" << left << "\" y=\"38\" font-size=\"14\">" << esc(line2) << "</text>\n";
  f << "<text x=\"" << left << "\" y=\"56\"><tspan fill=\"#1f77b4\">&#9632; paged (kvpager)</tspan>  "
       "<tspan fill=\"#ff7f0e\">&#9632; contiguous (max_model_len reserved per request)</tspan></text>\n";
  for (std::size_t k = 0; k < 4; ++k) {
    const panel& pn = panels[k];
    const double y0 = top + static_cast<double>(k) * (panel_h + gap) + 20;
    double ymax = 0;
    for (const auto* v : {&paged, &contiguous})
      for (const step_sample& x : *v) ymax = std::max(ymax, pn.get(x));
    if (k == 0) ymax = 1.0;
    if (ymax <= 0) ymax = 1;
    const double pw = width - left - right;
    f << "<text x=\"" << left << "\" y=\"" << y0 - 6 << "\" font-weight=\"bold\">" << esc(pn.name) << "</text>\n";
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#999\"/>\n", left,
                  y0, pw, panel_h);
    f << buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", left - 6, y0 + 10,
                  ymax);
    f << buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">0</text>\n", left - 6,
                  y0 + panel_h);
    f << buf;
    for (int q = 0; q <= 4; ++q) {  // step ticks
      const double x = left + pw * q / 4.0;
      std::snprintf(buf, sizeof buf,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\"/>"
                    "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\">%.0f</text>\n",
                    x, y0 + panel_h, x, y0 + panel_h + 4, x, y0 + panel_h + 14, steps * q / 4.0);
      f << buf;
    }
    for (const auto* v : {&paged, &contiguous}) {
      if (v->empty()) continue;
      f << "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" << (v == &paged ? "#1f77b4" : "#ff7f0e")
        << "\" points=\"";
      const std::size_t stride = std::max<std::size_t>(1, v->size() / 800);
      for (std::size_t i = 0; i < v->size(); i += stride) {
        const step_sample& x = (*v)[i];
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", left + pw * static_cast<double>(x.step) / steps,
                      y0 + panel_h - panel_h * pn.get(x) / ymax);
        f << buf;
      }
      f << "\"/>\n";
    }
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">scheduler steps</text>\n",
                width - right, height - 6);
  f << buf << "</svg>\n";
  return static_cast<bool>(f);
}

}  // namespace kvsim
