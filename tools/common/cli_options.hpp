// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one validation layer of the command-line tools (kvpager-plan, kvpager-sim): CLI11 validators that state the
// accepted range in their message and refuse what the range cannot hold (NaN, infinities, values whose byte or token
// count would not fit in 64 bits), and the parse step that turns a refused command line into exit status 2. Every
// numeric option of these tools goes through one of these validators.

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>

namespace kvtools {

/// Exit status of a refused command line or input (a value out of range, an unknown name, a bad file).
inline constexpr int exit_bad_input = 2;

/// "%g" of x, for the range in a message.
inline std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15g", x);
  return buf;
}

/// A finite number in [lo, hi] ((lo, hi] with `lo_open`): NaN, infinities and anything outside are refused with
/// "must be a finite number in [lo, hi]", the option named by CLI11.
inline CLI::Validator finite_range(double lo, double hi, bool lo_open = false) {
  const std::string range = std::string(lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + "]";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double x = 0;
        std::size_t used = 0;
        try {
          x = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool inside = used == text.size() && std::isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi;
        return inside ? std::string() : "must be a finite number in " + range + ", not '" + text + "'";
      },
      "FLOAT in " + range);
}

/// An integer in [lo, hi], refused otherwise with "must be an integer in [lo, hi]".
inline CLI::Validator int_range(std::int64_t lo, std::int64_t hi) {
  std::string range(1, '[');  // appended, not "[" + ...: GCC 12 warns falsely on that at -O3 (bug 105329)
  range += std::to_string(lo);
  range += ", ";
  range += std::to_string(hi);
  range += ']';
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        long long x = 0;
        std::size_t used = 0;
        try {
          x = std::stoll(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool inside = used == text.size() && !text.empty() && x >= lo && x <= hi;
        return inside ? std::string() : "must be an integer in " + range + ", not '" + text + "'";
      },
      "INT in " + range);
}

/// The largest GiB count whose bytes the tools accept: 1 PiB (2^20 GiB; an int64 holds 2^33 GiB of bytes).
inline constexpr double max_gib = 1024.0 * 1024.0;

/// Parses argv; returns -1 to go on, or the exit status: 0 after --help, exit_bad_input for any refused option
/// (CLI11's message, which names the option and its range, on stderr).
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : exit_bad_input;
  }
  return -1;
}

}  // namespace kvtools
