// SPDX-License-Identifier: Apache-2.0
// kvpager-generate's input parsers under mutation (bounded: a fixed number of cases, a fixed seed; run under ASan and
// UBSan by the sanitizer preset): the safetensors reader, the requests line parser and the config parser never crash,
// never read outside the bytes they were given, and either accept with every tensor inside the data or refuse with a
// message naming the file.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "requests.hpp"
#include "safetensors.hpp"

namespace {

#ifdef KVPAGER_TEST_REDUCED
constexpr int cases = 4000;
#else
constexpr int cases = 20000;
#endif

std::vector<std::byte> valid_file() {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"c":{"dtype":"F16","shape":[0],"data_offsets":[32,32]}})";
  std::vector<std::byte> b(8 + header.size() + 32);
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
  std::memcpy(b.data() + 8, header.data(), header.size());
  for (std::size_t i = 8 + header.size(); i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 7);
  return b;
}

void mutate(std::mt19937_64& rng, std::vector<std::byte>& b) {
  const int kind = static_cast<int>(rng() % 5);
  const auto pos = [&] { return b.empty() ? 0 : static_cast<std::size_t>(rng() % b.size()); };
  switch (kind) {
    case 0:
      if (!b.empty()) b[pos()] = static_cast<std::byte>(rng());
      break;
    case 1:
      b.resize(pos());
      break;
    case 2:
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos()), static_cast<std::byte>("{}[],:\"0123456789e-"[rng() % 19]));
      break;
    case 3:
      if (!b.empty()) b.erase(b.begin() + static_cast<std::ptrdiff_t>(pos()));
      break;
    default:  // the header length itself
      if (b.size() >= 8) b[rng() % 8] = static_cast<std::byte>(rng());
      break;
  }
}

TEST(GenerateFuzz, SafetensorsReaderRefusesOrStaysInsideItsBytes) {
  std::mt19937_64 rng(20261202);
  const std::vector<std::byte> base = valid_file();
  {
    kvgen::safetensors_file f;
    ASSERT_EQ(f.open_bytes(base, "valid"), "");
    ASSERT_EQ(f.tensors().size(), 3U);
  }
  int accepted = 0;
  for (int i = 0; i < cases; ++i) {
    std::vector<std::byte> b = base;
    for (int m = 0, k = 1 + static_cast<int>(rng() % 4); m < k; ++m) mutate(rng, b);
    // A heap copy of exactly the mutated size, so ASan catches a read past its end.
    std::unique_ptr<std::byte[]> exact(new std::byte[b.size() + 1]);
    std::memcpy(exact.get(), b.data(), b.size());
    kvgen::safetensors_file f;
    const std::string err = f.open_bytes(std::span<const std::byte>(exact.get(), b.size()), "case");
    if (!err.empty()) {
      ASSERT_EQ(err.rfind("case: ", 0), 0U) << err;
      ASSERT_TRUE(f.tensors().empty());
      continue;
    }
    ++accepted;
    for (const kvgen::st_tensor& t : f.tensors()) {
      ASSERT_GE(t.data, exact.get());
      ASSERT_LE(t.data + t.bytes, exact.get() + b.size());
      ASSERT_EQ(t.bytes, t.numel() * static_cast<std::int64_t>(kvgen::elem_size(t.dtype)));
      volatile std::byte sink{};
      for (std::int64_t x = 0; x < t.bytes; ++x) sink = t.data[x];  // every byte readable
      (void)sink;
    }
  }
  EXPECT_GT(accepted, 0);  // some mutations (data bytes) leave the file valid
}

TEST(GenerateFuzz, RequestLinesAreParsedOrRefusedWithTheirLine) {
  std::mt19937_64 rng(7);
  const std::string base =
      R"({"id": "x", "prompt_ids": [1, 2, 3], "max_tokens": 5, "n": 2, "temperature": 0.5, "top_k": 3, "top_p": 0.9, "seed": 4, "ignore_eos": true})";
  int ok = 0;
  for (int i = 0; i < cases; ++i) {
    std::vector<std::byte> b(base.size());
    std::memcpy(b.data(), base.data(), base.size());
    for (int m = 0, k = 1 + static_cast<int>(rng() % 3); m < k; ++m) mutate(rng, b);
    const std::string text(reinterpret_cast<const char*>(b.data()), b.size());
    kvgen::gen_request r;
    const std::string err = kvgen::parse_request(text, "file:9", r);
    if (!err.empty()) {
      ASSERT_EQ(err.rfind("file:9: ", 0), 0U) << err;
      continue;
    }
    ++ok;
    ASSERT_FALSE(r.prompt.empty());
    ASSERT_GE(r.n, 1);
    ASSERT_LE(r.n, kvgen::max_samples);
    ASSERT_GE(r.max_tokens, 0);
    ASSERT_GE(r.sampling.temperature, 0.0);
    ASSERT_TRUE(r.sampling.top_p > 0 && r.sampling.top_p <= 1);
  }
  EXPECT_GT(ok, 0);
}

TEST(GenerateFuzz, ConfigParserRefusesWithTheFileNamed) {
  std::mt19937_64 rng(11);
  const std::string base =
      R"({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 128, "intermediate_size": 64, "num_hidden_layers": 2,)"
      R"( "num_attention_heads": 2, "num_key_value_heads": 1, "rope_theta": 10000.0, "sliding_window": 8,)"
      R"( "use_sliding_window": true, "max_window_layers": 1, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,)"
      R"( "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, "eos_token_id": [1, 2]})";
  const auto dir = std::filesystem::temp_directory_path() / ("kvpager_cfg_fuzz_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "config.json") << base;
    kvgen::model_config c;
    ASSERT_EQ(kvgen::parse_config(dir.string(), c), "");
    EXPECT_EQ(c.window_left, (std::vector<std::int32_t>{-1, 7}));
  }
  const int n = cases / 8;
  for (int i = 0; i < n; ++i) {
    std::vector<std::byte> b(base.size());
    std::memcpy(b.data(), base.data(), base.size());
    for (int m = 0, k = 1 + static_cast<int>(rng() % 3); m < k; ++m) mutate(rng, b);
    std::ofstream(dir / "config.json", std::ios::trunc | std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    kvgen::model_config c;
    const std::string err = kvgen::parse_config(dir.string(), c);
    if (!err.empty()) {
      ASSERT_NE(err.find("config.json"), std::string::npos) << err;
      continue;
    }
    ASSERT_GT(c.num_layers, 0);
    ASSERT_EQ(c.window_left.size(), static_cast<std::size_t>(c.num_layers));
    ASSERT_EQ(c.num_heads % c.num_kv_heads, 0);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
