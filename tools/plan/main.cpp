// SPDX-License-Identifier: Apache-2.0
// kvpager-plan: sizes the paged KV pool of built-in models on cards of given memory, per tensor-parallel rank, with
// the library's sizing functions (include/kvpager/sizing/kv_sizing.hpp). Prints a table, or with --json one JSON
// document.
//
//   kvpager-plan [--model NAME]... [--card-gib GIB]... [--tp N]... [--utilization F] [--kv-dtype-bytes N]
//                [--weight-dtype-bytes N] [--block-size N] [--seq-len N] [--reserve-gib GIB] [--json]
//
// Defaults: every built-in model; cards of 24 GiB (RTX 4090), 80 GiB (A100/H100 80GB) and 141 GiB (H200); TP 1, 2,
// 4, 8; 90% of a card usable; fp16 KV and weights; 16-token blocks; 2048-token sequences; 1 GiB of activations per
// card. Exit status: 0 on success, 2 on a refused command line (a value outside its range, which the message states;
// an unknown model lists the choices).
//
// CLI11 reports command-line errors by exception; this tool is therefore built with exceptions even in the
// -fno-exceptions preset (the library headers it uses never throw).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <kvpager/sizing/hybrid_sizing.hpp>
#include <kvpager/sizing/kv_sizing.hpp>
#include <kvpager/sizing/model_shape.hpp>
#include <kvpager/sizing/tensor_parallel.hpp>

#include "cli_options.hpp"

namespace {

using kvpager::errc;
using kvpager::model_shape;
using kvpager::pool_plan;
using kvpager::pool_request;

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

std::string card_label(double gib) {
  if (gib == 24) return "24 GiB (RTX 4090)";
  if (gib == 80) return "80 GiB (A100/H100 80GB)";
  if (gib == 141) return "141 GiB (H200)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g GiB", gib);
  return buf;
}

// Bytes in the largest unit that keeps the number at least 1: "512 KiB", "12.55 GiB".
std::string human(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  auto v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (v == static_cast<double>(static_cast<std::int64_t>(v)))
    std::snprintf(buf, sizeof buf, "%lld %s", static_cast<long long>(v), units[u]);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::string model_choices() {
  std::string s;
  for (const model_shape& m : kvpager::builtin_models) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

struct settings {
  std::vector<std::string> models;
  std::vector<double> cards_gib{24, 80, 141};
  std::vector<std::int32_t> tps{1, 2, 4, 8};
  double utilization = 0.9;
  std::int32_t kv_dtype_bytes = 2;
  std::int32_t weight_dtype_bytes = 2;
  std::int32_t block_size = 16;
  std::int64_t seq_len = 2048;
  double reserve_gib = 1.0;
  bool json = false;
  bool hybrid = false;     // --hybrid: the built-in hybrid models' KV per request by layer kind
  double kv_gib = 40.0;    // --kv-gib: the KV budget the hybrid table counts concurrent requests in
};

/// --hybrid: per built-in hybrid model and context length (8k, 32k, 128k), one request's KV when window and chunked
/// layers keep only what their next token reads (kvpager's groups, no padding), against vLLM's padded grouping and
/// one full-attention group, and how many such requests fit in --kv-gib.
nlohmann::json hybrid_table(const settings& s, bool print) {
  nlohmann::json rows = nlohmann::json::array();
  const auto budget = static_cast<std::int64_t>(s.kv_gib * GiB);
  if (print) {
    std::printf("kvpager-plan: KV of one request by layer kind (%d-token blocks, KV %d bytes/elem), requests in %g GiB "
                "of KV\n\n",
                s.block_size, s.kv_dtype_bytes, s.kv_gib);
    std::printf("%-16s %7s %13s %13s %13s %9s %8s %8s %8s %9s %9s\n", "model", "context", "KV/tok groups",
                "KV/tok vLLM", "KV/tok 1 grp", "alloc/need", "fit grp", "fit vLLM", "fit 1 grp", "x vs 1", "x vs vLLM");
  }
  for (const kvpager::hybrid_model& m : kvpager::builtin_hybrid_models) {
    for (const std::int64_t ctx : {std::int64_t{8192}, std::int64_t{32768}, std::int64_t{131072}}) {
      const auto r = kvpager::request_kv(m, ctx, s.block_size, s.kv_dtype_bytes);
      if (!r.ok()) continue;
      const kvpager::hybrid_request_kv& k = *r;
      const std::int64_t fit_groups = budget / std::max<std::int64_t>(1, k.groups);
      const std::int64_t fit_vllm = budget / std::max<std::int64_t>(1, k.vllm_padded);
      const std::int64_t fit_one = budget / std::max<std::int64_t>(1, k.one_group);
      nlohmann::json blocks = nlohmann::json::array();
      for (std::int32_t i = 0; i < m.num_kinds; ++i) blocks.push_back(k.kind_blocks[static_cast<std::size_t>(i)]);
      rows.push_back({{"model", m.name},
                      {"source", m.source},
                      {"context", ctx},
                      {"kv_bytes_per_token_groups", static_cast<double>(k.groups) / static_cast<double>(ctx)},
                      {"kv_bytes_per_token_vllm_padded", static_cast<double>(k.vllm_padded) / static_cast<double>(ctx)},
                      {"kv_bytes_per_token_one_group", static_cast<double>(k.one_group) / static_cast<double>(ctx)},
                      {"allocated_over_needed", k.allocated_over_needed()},
                      {"blocks_per_layer_by_kind", blocks},
                      {"vllm_groups", k.vllm_groups},
                      {"vllm_group_size", k.vllm_group_size},
                      {"vllm_padding_layers", k.vllm_padding_layers},
                      {"requests_groups", fit_groups},
                      {"requests_vllm_padded", fit_vllm},
                      {"requests_one_group", fit_one}});
      const auto times = [&](std::int64_t other) {
        char buf[32];
        if (other > 0)
          std::snprintf(buf, sizeof buf, "%.2fx", static_cast<double>(fit_groups) / static_cast<double>(other));
        else
          std::snprintf(buf, sizeof buf, "%s", fit_groups > 0 ? "only" : "-");  // the other fits none
        return std::string(buf);
      };
      if (print)
        std::printf("%-16s %6lldk %13s %13s %13s %9.4f %8lld %8lld %9lld %9s %9s\n", std::string(m.name).c_str(),
                    static_cast<long long>(ctx / 1024), human(k.groups / ctx).c_str(),
                    human(k.vllm_padded / ctx).c_str(), human(k.one_group / ctx).c_str(),
                    k.allocated_over_needed(), static_cast<long long>(fit_groups), static_cast<long long>(fit_vllm),
                    static_cast<long long>(fit_one), times(fit_one).c_str(), times(fit_vllm).c_str());
    }
  }
  if (print)
    std::printf("\nKV/tok: one request's KV bytes at that context over its tokens; alloc/need: the groups' blocks over "
                "the K/V their next token strictly reads (window layers keep whole blocks); fit: requests of that "
                "context in the budget; x: how many more fit with kvpager's groups.\n");
  return rows;
}

pool_request request(const settings& s, const model_shape& m, double card_gib, std::int32_t tp) {
  pool_request r;
  r.model = m;
  r.card_bytes = static_cast<std::int64_t>(card_gib * GiB);
  r.utilization = s.utilization;
  r.kv_dtype_bytes = s.kv_dtype_bytes;
  r.weight_dtype_bytes = s.weight_dtype_bytes;
  r.block_size = s.block_size;
  r.tp = tp;
  r.activation_reserve_bytes = static_cast<std::int64_t>(s.reserve_gib * GiB);
  r.seq_len = s.seq_len;
  return r;
}

nlohmann::json to_json(const settings& s, const std::vector<model_shape>& models) {
  nlohmann::json doc;
  doc["settings"] = {{"utilization", s.utilization},
                     {"kv_dtype_bytes", s.kv_dtype_bytes},
                     {"weight_dtype_bytes", s.weight_dtype_bytes},
                     {"block_size", s.block_size},
                     {"seq_len", s.seq_len},
                     {"activation_reserve_bytes", static_cast<std::int64_t>(s.reserve_gib * GiB)}};
  doc["models"] = nlohmann::json::array();
  for (const model_shape& m : models)
    doc["models"].push_back({{"name", m.name},
                             {"source", m.source},
                             {"num_layers", m.num_layers},
                             {"num_q_heads", m.num_q_heads},
                             {"num_kv_heads", m.num_kv_heads},
                             {"head_dim", m.head_dim},
                             {"num_params", m.num_params},
                             {"kv_bytes_per_token_per_layer", *kvpager::kv_bytes_per_token_per_layer(m, s.kv_dtype_bytes)},
                             {"kv_bytes_per_token", *kvpager::kv_bytes_per_token(m, s.kv_dtype_bytes)}});
  doc["plans"] = nlohmann::json::array();
  for (const double card : s.cards_gib)
    for (const model_shape& m : models)
      for (const std::int32_t tp : s.tps) {
        const pool_request r = request(s, m, card, tp);
        const kvpager::result<pool_plan> p = kvpager::plan_pool(r);
        nlohmann::json row = {{"card", card_label(card)}, {"card_bytes", r.card_bytes}, {"model", m.name}, {"tp", tp},
                              {"fits", p.ok()}};
        if (p.ok()) {
          row.update({{"kv_heads_per_rank", p->kv_heads_per_rank},
                      {"kv_bytes_per_token_per_layer", p->kv_bytes_per_token_per_layer},
                      {"kv_bytes_per_token", p->kv_bytes_per_token},
                      {"block_bytes", p->block_bytes},
                      {"weight_bytes", p->weight_bytes},
                      {"budget_bytes", p->budget_bytes},
                      {"num_blocks", p->num_blocks},
                      {"token_capacity", p->token_capacity},
                      {"max_sequences", p->max_sequences}});
        } else {
          row["error"] = to_string(p.code());
          row["reason"] = p.error().message();
        }
        doc["plans"].push_back(std::move(row));
      }
  return doc;
}

void print_table(const settings& s, const std::vector<model_shape>& models) {
  std::printf("kvpager-plan: paged KV pool per tensor-parallel rank\n");
  std::printf("usable %.0f%% of each card, KV %d bytes/elem, weights %d bytes/param, %d-token blocks, "
              "%s activation reserve per card, sequences of %lld tokens\n\n",
              s.utilization * 100, s.kv_dtype_bytes, s.weight_dtype_bytes, s.block_size,
              human(static_cast<std::int64_t>(s.reserve_gib * GiB)).c_str(), static_cast<long long>(s.seq_len));
  std::printf("%-12s %6s %7s %8s %8s %9s %15s %13s  %s\n", "model", "layers", "q_heads", "kv_heads", "head_dim",
              "params", "KV/token/layer", "KV/token", "source");
  for (const model_shape& m : models)
    std::printf("%-12s %6d %7d %8d %8d %8.2fB %15s %13s  %s\n", std::string(m.name).c_str(), m.num_layers,
                m.num_q_heads, m.num_kv_heads, m.head_dim, static_cast<double>(m.num_params) / 1e9,
                human(*kvpager::kv_bytes_per_token_per_layer(m, s.kv_dtype_bytes)).c_str(),
                human(*kvpager::kv_bytes_per_token(m, s.kv_dtype_bytes)).c_str(), std::string(m.source).c_str());
  std::printf("KV/token/layer is one layer's K and V of one token; KV/token is all layers. The seed's \"16KB per "
              "token\" for a 7B model is Llama-2-7B's per-layer figure (fp16), and its 32 MB for 2048 tokens one "
              "layer's: over 32 layers a token takes 512 KiB and 2048 tokens 1 GiB.\n");
  for (const double card : s.cards_gib) {
    std::printf("\ncard %s, per rank:\n", card_label(card).c_str());
    std::printf("%-12s %3s %8s %12s %12s %11s %10s %11s %9s\n", "model", "TP", "kv_heads", "weights", "KV budget",
                "block", "blocks", "tokens", "seqs");
    for (const model_shape& m : models)
      for (const std::int32_t tp : s.tps) {
        const kvpager::result<pool_plan> p = kvpager::plan_pool(request(s, m, card, tp));
        if (p.ok()) {
          std::printf("%-12s %3d %8d %12s %12s %11s %10lld %11lld %9lld\n", std::string(m.name).c_str(), tp,
                      p->kv_heads_per_rank, human(p->weight_bytes).c_str(), human(p->budget_bytes).c_str(),
                      human(p->block_bytes).c_str(), static_cast<long long>(p->num_blocks),
                      static_cast<long long>(p->token_capacity), static_cast<long long>(p->max_sequences));
        } else if (p.code() == errc::out_of_blocks) {
          std::printf("%-12s %3d   does not fit: weights and reserve exceed the usable memory\n",
                      std::string(m.name).c_str(), tp);
        } else {
          std::printf("%-12s %3d   cannot split: %s\n", std::string(m.name).c_str(), tp, p.error().message());
        }
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvpager-plan: paged KV pool sizes of built-in models per card and tensor-parallel rank"};
  settings s;
  using kvtools::finite_range;
  using kvtools::int_range;
  constexpr std::int64_t int32_max = std::numeric_limits<std::int32_t>::max();
  app.add_option("--model", s.models, "built-in model, repeatable (default: all): " + model_choices());
  app.add_option("--card-gib", s.cards_gib, "card memory in GiB, repeatable (default: 24 80 141)")
      ->check(finite_range(0, kvtools::max_gib, true));
  app.add_option("--tp", s.tps, "tensor-parallel degrees, repeatable (default: 1 2 4 8)")->check(int_range(1, int32_max));
  app.add_option("--utilization", s.utilization, "fraction of a card the engine may use (default 0.9)")
      ->check(finite_range(0.0, 1.0, true));
  app.add_option("--kv-dtype-bytes", s.kv_dtype_bytes, "bytes per KV element (default 2: fp16/bf16; 1: fp8)")
      ->check(int_range(1, 8));
  app.add_option("--weight-dtype-bytes", s.weight_dtype_bytes, "bytes per weight (default 2)")->check(int_range(1, 8));
  app.add_option("--block-size", s.block_size, "tokens per block (default 16)")->check(int_range(1, 1 << 20));
  app.add_option("--seq-len", s.seq_len, "tokens per sequence for the concurrency column (default 2048)")
      ->check(int_range(1, int32_max));
  app.add_option("--reserve-gib", s.reserve_gib, "activation reserve per card in GiB (default 1)")
      ->check(finite_range(0, kvtools::max_gib));
  app.add_flag("--json", s.json, "print one JSON document instead of the table");
  app.add_flag("--hybrid", s.hybrid,
               "the built-in hybrid models (sliding-window and chunked layers): KV per request at 8k, 32k and 128k "
               "by layer kind, against vLLM's padded grouping and one full group");
  app.add_option("--kv-gib", s.kv_gib, "with --hybrid: the KV budget requests are counted in (default 40)")
      ->check(finite_range(0, kvtools::max_gib, true));
  if (const int rc = kvtools::parse(app, argc, argv); rc >= 0) return rc;
  if (s.hybrid) {
    const nlohmann::json rows = hybrid_table(s, !s.json);
    if (s.json) std::cout << nlohmann::json{{"hybrid", rows}}.dump(2) << '\n';
    return 0;
  }

  std::vector<model_shape> models;
  if (s.models.empty()) models.assign(kvpager::builtin_models.begin(), kvpager::builtin_models.end());
  for (const std::string& name : s.models) {
    const kvpager::result<model_shape> m = kvpager::find_model(name);
    if (!m.ok()) {
      std::fprintf(stderr, "kvpager-plan: unknown model '%s'; choose one of: %s\n", name.c_str(), model_choices().c_str());
      return kvtools::exit_bad_input;
    }
    models.push_back(*m);
  }

  if (s.json)
    std::cout << to_json(s, models).dump(2) << '\n';
  else
    print_table(s, models);
  return 0;
}
