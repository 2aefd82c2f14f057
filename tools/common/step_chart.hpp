// SPDX-License-Identifier: Apache-2.0
#pragma once
// The tools' step chart (--report DIR/chart.svg of kvpager-sim and kvpager-generate): four panels over the scheduler
// steps (KV usage, running requests, waiting requests, cumulative swap events), one line per series, written by hand
// as SVG 1.1. At most ~800 points per line (evenly sampled).

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace kvtools {

/// One sample of a series: the step, the steps it stands for (1, or an idle stretch), and the four panels' values.
struct chart_point {
  std::int64_t step = 0;
  std::int64_t span = 1;
  double kv_usage = 0, running = 0, waiting = 0, swaps = 0;
};

struct chart_series {
  std::string label;
  const char* color = "#1f77b4";
  std::vector<chart_point> points;
};

inline bool write_step_chart(const std::string& path, const std::string& title, const std::vector<chart_series>& series) {
  std::ofstream f(path);
  if (!f) return false;
  constexpr double width = 1100, panel_h = 150, left = 70, right = 20, top = 66, gap = 40;
  struct panel {
    const char* name;
    double (*get)(const chart_point&);
  };
  const std::array<panel, 4> panels{{
      {"KV usage (share of the pool allocated)", [](const chart_point& x) { return x.kv_usage; }},
      {"running requests (batch)", [](const chart_point& x) { return x.running; }},
      {"waiting requests", [](const chart_point& x) { return x.waiting; }},
      {"swap events (cumulative)", [](const chart_point& x) { return x.swaps; }},
  }};
  const double height = top + 4 * (panel_h + gap) + 20;
  double steps = 1;  // the last step of any series (samples may span several steps, or be every k-th)
  for (const chart_series& s : series)
    if (!s.points.empty()) steps = std::max(steps, static_cast<double>(s.points.back().step + s.points.back().span - 1));
  auto esc = [](const std::string& s) {
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
  // path may still run past the edge of the second).
  const auto fit = static_cast<std::size_t>((width - left - 10) / 7.6);
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
  f << "<text x=\"" << left << "\" y=\"56\">";
  for (std::size_t i = 0; i < series.size(); ++i)
    f << (i > 0 ? "  " : "") << "<tspan fill=\"" << series[i].color << "\">&#9632; " << esc(series[i].label)
      << "</tspan>";
  f << "</text>\n";
  for (std::size_t k = 0; k < panels.size(); ++k) {
    const panel& pn = panels[k];
    const double y0 = top + static_cast<double>(k) * (panel_h + gap) + 20;
    double ymax = 0;
    for (const chart_series& s : series)
      for (const chart_point& x : s.points) ymax = std::max(ymax, pn.get(x));
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
    for (const chart_series& s : series) {
      if (s.points.empty()) continue;
      f << "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" << s.color << "\" points=\"";
      const std::size_t stride = std::max<std::size_t>(1, s.points.size() / 800);
      for (std::size_t i = 0; i < s.points.size(); i += stride) {
        const chart_point& x = s.points[i];
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

}  // namespace kvtools
