// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a run produces per request (the --output JSONL), and when a stop rule ends a sample: shared by the engine and
// the reference so both decide identically.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "requests.hpp"
#include "sampling.hpp"

namespace kvgen {

struct sample_result {
  std::vector<std::int32_t> tokens;
  std::string finish_reason;  ///< "stop" (an eos id), "length" (max_tokens or the context), or why it was refused
  std::vector<position_record> positions;  ///< one per generated token
  double first_token_s = -1;  ///< time to first token (s since the run began), -1 when none
};

struct request_result {
  std::vector<sample_result> samples;
};

/// The rules that end a sample after `tok` was appended: an eos id (unless ignore_eos), max_tokens, or the context.
/// Returns "" when it continues.
inline const char* stop_reason(const gen_request& r, const std::vector<std::int32_t>& eos, std::int32_t tok,
                               std::size_t generated, std::int32_t max_model_len) {
  if (!r.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end()) return "stop";
  if (generated >= static_cast<std::size_t>(r.max_tokens)) return "length";
  if (static_cast<std::int64_t>(r.prompt.size() + generated) >= max_model_len) return "length";
  return "";
}

/// One --output line.
inline nlohmann::ordered_json result_json(const gen_request& r, const request_result& res, std::int32_t logprobs,
                                  std::int32_t top_logits) {
  nlohmann::ordered_json samples = nlohmann::ordered_json::array();
  for (const sample_result& s : res.samples) {
    nlohmann::ordered_json o = {{"token_ids", s.tokens}, {"finish_reason", s.finish_reason}};
    if (logprobs > 0) {
      nlohmann::ordered_json lp = nlohmann::ordered_json::array();
      for (const position_record& p : s.positions) {
        nlohmann::ordered_json ids = nlohmann::ordered_json::array(), vals = nlohmann::ordered_json::array();
        for (std::size_t i = 0; i < p.top_ids.size() && i < static_cast<std::size_t>(logprobs); ++i) {
          ids.push_back(p.top_ids[i]);
          vals.push_back(static_cast<double>(p.top_logits[i]) - p.lse);
        }
        lp.push_back({{"token_logprob", static_cast<double>(p.token_logit) - p.lse}, {"top_ids", ids}, {"top_logprobs", vals}});
      }
      o["logprobs"] = lp;
    }
    if (top_logits > 0) {
      nlohmann::ordered_json ids = nlohmann::ordered_json::array(), vals = nlohmann::ordered_json::array(), lse = nlohmann::ordered_json::array();
      for (const position_record& p : s.positions) {
        nlohmann::ordered_json pi = nlohmann::ordered_json::array(), pv = nlohmann::ordered_json::array();
        for (std::size_t i = 0; i < p.top_ids.size() && i < static_cast<std::size_t>(top_logits); ++i) {
          pi.push_back(p.top_ids[i]);
          pv.push_back(p.top_logits[i]);
        }
        ids.push_back(pi);
        vals.push_back(pv);
        lse.push_back(p.lse);
      }
      o["top_ids"] = ids;
      o["top_logits"] = vals;
      o["lse"] = lse;
    }
    samples.push_back(std::move(o));
  }
  return {{"id", r.id}, {"samples", samples}};
}

}  // namespace kvgen
