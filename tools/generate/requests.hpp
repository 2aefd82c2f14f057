// SPDX-License-Identifier: Apache-2.0
#pragma once
// The requests file: JSON Lines, one request an object per line (blank lines skipped):
//   {"id": "a" | 7, "prompt_ids": [1, 2, 3], "max_tokens": 16, "n": 1, "temperature": 0, "top_k": 0, "top_p": 1,
//    "seed": 0, "ignore_eos": false}
// Only prompt_ids is required. Every error names FILE:LINE and the field; a file with an error is refused whole.

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling.hpp"

namespace kvgen {

struct gen_request {
  nlohmann::json id;  ///< as given (string or integer); the line number when absent
  std::vector<std::int32_t> prompt;
  std::int32_t max_tokens = 16;
  std::int32_t n = 1;
  sampling_params sampling;
  bool ignore_eos = false;
  std::int32_t line = 0;
};

/// The most samples of one request (n).
inline constexpr std::int32_t max_samples = 256;

/// Parses one line (`where` is FILE:LINE). Returns "" or the error.
inline std::string parse_request(const std::string& text, const std::string& where, gen_request& r) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return where + ": not valid JSON";
  if (!j.is_object()) return where + ": not a JSON object";
  for (const auto& [k, v] : j.items()) {
    const auto bad = [&](const std::string& why) { return where + ": field '" + k + "' " + why; };
    const auto integer = [&](std::int64_t lo, std::int64_t hi, std::int64_t& out) -> std::string {
      if (!v.is_number_integer()) return bad("must be an integer");
      const std::int64_t x = v.is_number_unsigned() && v.get<std::uint64_t>() > INT64_MAX ? INT64_MAX : v.get<std::int64_t>();
      if (x < lo || x > hi) return bad("must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not " + v.dump());
      out = x;
      return "";
    };
    std::int64_t x = 0;
    if (k == "id") {
      if (!v.is_string() && !v.is_number_integer()) return bad("must be a string or an integer");
      r.id = v;
    } else if (k == "prompt_ids") {
      if (!v.is_array()) return bad("must be an array of token ids");
      r.prompt.clear();
      for (const auto& t : v) {
        if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() > INT32_MAX)
          return bad("must hold non-negative 32-bit token ids, not " + t.dump());
        r.prompt.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
      }
    } else if (k == "max_tokens") {
      if (std::string e = integer(0, INT32_MAX, x); !e.empty()) return e;
      r.max_tokens = static_cast<std::int32_t>(x);
    } else if (k == "n") {
      if (std::string e = integer(1, max_samples, x); !e.empty()) return e;
      r.n = static_cast<std::int32_t>(x);
    } else if (k == "top_k") {
      if (std::string e = integer(-1, INT32_MAX, x); !e.empty()) return e;
      r.sampling.top_k = static_cast<std::int32_t>(x);
    } else if (k == "seed") {
      if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() < 0))
        return bad("must be a non-negative integer");
      r.sampling.seed = v.get<std::uint64_t>();
    } else if (k == "temperature" || k == "top_p") {
      if (!v.is_number() || !std::isfinite(v.get<double>())) return bad("must be a finite number");
      const double d = v.get<double>();
      if (k == "temperature") {
        if (d < 0) return bad("must not be negative");
        r.sampling.temperature = d;
      } else {
        if (!(d > 0 && d <= 1)) return bad("must be in (0, 1]");
        r.sampling.top_p = d;
      }
    } else if (k == "ignore_eos") {
      if (!v.is_boolean()) return bad("must be true or false");
      r.ignore_eos = v.get<bool>();
    } else {
      return where + ": unknown field '" + k + "'";
    }
  }
  if (!j.contains("prompt_ids")) return where + ": required field 'prompt_ids' is missing";
  if (r.prompt.empty()) return where + ": field 'prompt_ids' is empty (a prompt needs at least one token)";
  return "";
}

/// Reads `path`; each request is checked against the model's vocabulary and context (max_model_len tokens).
inline std::string read_requests(const std::string& path, std::int32_t vocab, std::int32_t max_model_len,
                                 std::vector<gen_request>& out) {
  out.clear();
  std::ifstream f(path, std::ios::binary);
  if (!f) return path + ": cannot open";
  std::string line;
  std::int32_t no = 0;
  std::unordered_set<std::string> ids;
  while (std::getline(f, line)) {
    ++no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(no);
    gen_request r;
    r.line = no;
    r.id = no;
    if (std::string e = parse_request(line, where, r); !e.empty()) return e;
    for (std::size_t i = 0; i < r.prompt.size(); ++i)
      if (r.prompt[i] >= vocab)
        return where + ": field 'prompt_ids': token " + std::to_string(r.prompt[i]) + " (index " + std::to_string(i) +
               ") is outside the vocabulary of " + std::to_string(vocab);
    if (static_cast<std::int64_t>(r.prompt.size()) > max_model_len)
      return where + ": the prompt has " + std::to_string(r.prompt.size()) + " tokens, longer than the model's context of " +
             std::to_string(max_model_len);
    if (!ids.insert(r.id.dump()).second) return where + ": id " + r.id.dump() + " is used by an earlier request";
    out.push_back(std::move(r));
    if (out.size() > 1'000'000) return path + ": more than 1000000 requests";
  }
  return "";
}

}  // namespace kvgen
