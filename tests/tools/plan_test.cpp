// SPDX-License-Identifier: Apache-2.0
// kvpager-plan --json: runs the tool and checks every number it prints against the library's sizing functions,
// the per-token figures of Llama-2-7B (512 KiB in total, 16 KiB per layer), and that the default run covers the
// three cards and TP = 1, 2, 4, 8 for every built-in model.
#include <kvpager/sizing/kv_sizing.hpp>
#include <kvpager/sizing/model_shape.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>

using namespace kvpager;
using nlohmann::json;

namespace {

// Runs kvpager-plan with `args`; its stdout parsed as JSON (discarded on a parse error), and its exit status.
json run_plan(const std::string& args, int* exit_status = nullptr) {
  const std::string cmd = std::string(KVPAGER_PLAN_EXE) + " " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return json::value_t::discarded;
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = pclose(p);
  if (exit_status != nullptr) *exit_status = st;
  return json::parse(out, nullptr, /*allow_exceptions=*/false);
}

std::int64_t i64(const json& j, const char* key) {
  EXPECT_TRUE(j.contains(key)) << key;
  return j.contains(key) ? j[key].get<std::int64_t>() : -1;
}

TEST(PlanCli, JsonAgreesWithTheLibrary) {
  const json doc = run_plan("--json");
  ASSERT_FALSE(doc.is_discarded());
  const json& settings = doc["settings"];
  const auto kv_bytes = static_cast<std::int32_t>(i64(settings, "kv_dtype_bytes"));
  EXPECT_EQ(kv_bytes, 2);
  EXPECT_EQ(i64(settings, "block_size"), 16);

  // The models: every built-in one, with the library's per-token figures.
  ASSERT_EQ(doc["models"].size(), builtin_models.size());
  for (const json& m : doc["models"]) {
    const result<model_shape> shape = find_model(m["name"].get<std::string>());
    ASSERT_TRUE(shape.ok());
    EXPECT_EQ(i64(m, "num_layers"), shape->num_layers);
    EXPECT_EQ(i64(m, "num_kv_heads"), shape->num_kv_heads);
    EXPECT_EQ(i64(m, "head_dim"), shape->head_dim);
    EXPECT_EQ(i64(m, "num_params"), shape->num_params);
    EXPECT_EQ(i64(m, "kv_bytes_per_token_per_layer"), *kv_bytes_per_token_per_layer(*shape, kv_bytes));
    EXPECT_EQ(i64(m, "kv_bytes_per_token"), *kv_bytes_per_token(*shape, kv_bytes));
    if (shape->name == "Llama-2-7B") {
      EXPECT_EQ(i64(m, "kv_bytes_per_token"), 512 * 1024);
      EXPECT_EQ(i64(m, "kv_bytes_per_token_per_layer"), 16 * 1024);
    }
  }

  // The plans: 3 cards x 7 models x TP 1, 2, 4, 8, each equal to plan_pool of the same request.
  ASSERT_EQ(doc["plans"].size(), 3 * builtin_models.size() * 4);
  std::set<std::int64_t> cards, tps;
  int fits = 0;
  for (const json& row : doc["plans"]) {
    const result<model_shape> shape = find_model(row["model"].get<std::string>());
    ASSERT_TRUE(shape.ok());
    pool_request r;
    r.model = *shape;
    r.card_bytes = i64(row, "card_bytes");
    r.utilization = settings["utilization"].get<double>();
    r.kv_dtype_bytes = kv_bytes;
    r.weight_dtype_bytes = static_cast<std::int32_t>(i64(settings, "weight_dtype_bytes"));
    r.block_size = static_cast<std::int32_t>(i64(settings, "block_size"));
    r.tp = static_cast<std::int32_t>(i64(row, "tp"));
    r.activation_reserve_bytes = i64(settings, "activation_reserve_bytes");
    r.seq_len = i64(settings, "seq_len");
    cards.insert(r.card_bytes);
    tps.insert(r.tp);
    const result<pool_plan> p = plan_pool(r);
    ASSERT_EQ(row["fits"].get<bool>(), p.ok()) << row.dump();
    if (!p.ok()) {
      EXPECT_EQ(row["error"].get<std::string>(), to_string(p.code()));
      continue;
    }
    ++fits;
    EXPECT_EQ(i64(row, "kv_heads_per_rank"), p->kv_heads_per_rank);
    EXPECT_EQ(i64(row, "kv_bytes_per_token_per_layer"), p->kv_bytes_per_token_per_layer);
    EXPECT_EQ(i64(row, "kv_bytes_per_token"), p->kv_bytes_per_token);
    EXPECT_EQ(i64(row, "block_bytes"), p->block_bytes);
    EXPECT_EQ(i64(row, "weight_bytes"), p->weight_bytes);
    EXPECT_EQ(i64(row, "budget_bytes"), p->budget_bytes);
    EXPECT_EQ(i64(row, "num_blocks"), p->num_blocks);
    EXPECT_EQ(i64(row, "token_capacity"), p->token_capacity);
    EXPECT_EQ(i64(row, "max_sequences"), p->max_sequences);
  }
  const std::int64_t GiB = std::int64_t{1} << 30;
  EXPECT_EQ(cards, (std::set<std::int64_t>{24 * GiB, 80 * GiB, 141 * GiB}));
  EXPECT_EQ(tps, (std::set<std::int64_t>{1, 2, 4, 8}));
  EXPECT_GT(fits, 60);  // most combinations fit; 70B models on one card and Qwen2.5-7B at TP 8 do not
}

TEST(PlanCli, OptionsReachThePlan) {
  const json doc = run_plan("--json --model qwen2.5-7b --card-gib 40 --tp 2 --utilization 0.8 --kv-dtype-bytes 1 "
                            "--block-size 32 --seq-len 1000 --reserve-gib 0.5");
  ASSERT_FALSE(doc.is_discarded());
  ASSERT_EQ(doc["plans"].size(), 1U);
  const json& row = doc["plans"][0];
  const result<pool_plan> p =
      plan_pool({*find_model("Qwen2.5-7B"), 40 * (std::int64_t{1} << 30), 0.8, 1, 2, 32, 2, std::int64_t{1} << 29, 1000});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(i64(row, "num_blocks"), p->num_blocks);
  EXPECT_EQ(i64(row, "max_sequences"), p->max_sequences);
  EXPECT_EQ(i64(row, "kv_bytes_per_token"), 14 * 1024);  // 2 x 2 KV heads x 128 x 1 byte (fp8) x 28 layers
}

TEST(PlanCli, UnknownModelIsAnError) {
  int st = 0;
  const json doc = run_plan("--json --model gpt-5 2>/dev/null", &st);
  EXPECT_NE(st, 0);
  EXPECT_TRUE(doc.is_discarded());  // nothing on stdout
}

}  // namespace
