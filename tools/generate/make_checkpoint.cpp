// SPDX-License-Identifier: Apache-2.0
// kvpager-make-checkpoint: writes a small Hugging Face checkpoint with random weights (fixed seed) for the tests, the
// main job and the benchmarks: config.json as transformers 4.x (rope_theta, torch_dtype) or 5.x (rope_parameters,
// dtype) writes it, generation_config.json, and model.safetensors (or --shards N files with
// model.safetensors.index.json). The weights are scaled so that a random model still has a peaked next-token
// distribution (greedy decoding neither collapses to one token nor sits on near ties): embeddings N(0, 1), input
// projections N(0, 1/in), output projections half that, norms 1 + N(0, 0.1^2), the LM head N(0, 16/hidden).
//
//   kvpager-make-checkpoint DIR [--family llama|qwen2|mistral] [--layers L] [--hidden H] [--heads N]
//       [--kv-heads K] [--head-dim D] [--intermediate I] [--vocab V] [--max-position P] [--window W] [--dtype
//       f32|bf16|f16] [--tie] [--rope-theta T] [--rope-scaling none|linear|llama3] [--rope-factor F] [--seed S]
//       [--shards N] [--config-format 4|5] [--eos ID]

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <kvpager/kernels/float16.hpp>

#include "cli_options.hpp"

namespace {

struct tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
};

struct normal_stream {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double operator()() {
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53, u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  }
};

std::string write_file(const std::string& path, const std::vector<const tensor*>& ts, const std::string& dtype) {
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", "pt"}};
  const std::size_t es = dtype == "F32" ? 4 : 2;
  std::uint64_t off = 0;
  for (const tensor* t : ts) {
    const std::uint64_t n = t->data.size() * es;
    h[t->name] = {{"dtype", dtype}, {"shape", t->shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string header = h.dump();
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream f(path, std::ios::binary);
  if (!f) return path + ": cannot write";
  const std::uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((len >> (8 * i)) & 0xFF));
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const tensor* t : ts)
    for (const float x : t->data) {
      if (es == 4) {
        f.write(reinterpret_cast<const char*>(&x), 4);
      } else {
        const std::uint16_t b = dtype == "BF16" ? kvpager::detail::float_to_bf16(x) : kvpager::detail::float_to_half(x);
        f.write(reinterpret_cast<const char*>(&b), 2);
      }
    }
  return f ? "" : path + ": write failed";
}

int run(int argc, char** argv) {
  CLI::App app{"kvpager-make-checkpoint: a small random-weight Hugging Face checkpoint (llama, qwen2, mistral)"};
  std::string dir, family = "llama", dtype = "f32", rope_scaling = "none";
  std::int32_t layers = 2, hidden = 256, heads = 4, kv_heads = 2, head_dim = 0, inter = 512, vocab = 512, max_pos = 2048,
               window = 0, shards = 1, format = 4, eos = 2;
  double theta = 10000.0, factor = 2.0;
  std::uint64_t seed = 1;
  bool tie = false;
  using kvtools::int_range;
  app.add_option("dir", dir, "output directory (created)")->required();
  app.add_option("--family", family, "llama, qwen2 or mistral");
  app.add_option("--layers", layers)->check(int_range(1, 256));
  app.add_option("--hidden", hidden)->check(int_range(1, 16384));
  app.add_option("--heads", heads)->check(int_range(1, 256));
  app.add_option("--kv-heads", kv_heads)->check(int_range(1, 256));
  app.add_option("--head-dim", head_dim, "explicit head_dim (0: hidden / heads, not written)")->check(int_range(0, 1024));
  app.add_option("--intermediate", inter)->check(int_range(1, 65536));
  app.add_option("--vocab", vocab)->check(int_range(2, 1 << 20));
  app.add_option("--max-position", max_pos)->check(int_range(1, 1 << 24));
  app.add_option("--window", window, "sliding_window (mistral; qwen2 with use_sliding_window); 0: none")
      ->check(int_range(0, 1 << 24));
  std::string layer_types;
  app.add_option("--layer-types", layer_types,
                 "qwen2: comma-separated full/sliding per layer, written as config.json's layer_types (needs --window)");
  app.add_option("--dtype", dtype, "f32, bf16 or f16");
  app.add_flag("--tie", tie, "tie_word_embeddings (no lm_head.weight)");
  app.add_option("--rope-theta", theta)->check(kvtools::finite_range(1, 1e12));
  app.add_option("--rope-scaling", rope_scaling, "none, linear or llama3");
  app.add_option("--rope-factor", factor)->check(kvtools::finite_range(1, 1e6));
  app.add_option("--seed", seed);
  app.add_option("--shards", shards)->check(int_range(1, 64));
  app.add_option("--config-format", format, "4: rope_theta/torch_dtype, 5: rope_parameters/dtype")->check(int_range(4, 5));
  app.add_option("--eos", eos, "eos_token_id")->check(int_range(0, (1 << 20) - 1));
  if (const int rc = kvtools::parse(app, argc, argv); rc >= 0) return rc;
  const auto bad = [](const std::string& m) {
    std::fprintf(stderr, "kvpager-make-checkpoint: %s\n", m.c_str());
    return kvtools::exit_bad_input;
  };
  if (family != "llama" && family != "qwen2" && family != "mistral") return bad("--family: llama, qwen2 or mistral");
  if (dtype != "f32" && dtype != "bf16" && dtype != "f16") return bad("--dtype: f32, bf16 or f16");
  if (rope_scaling != "none" && rope_scaling != "linear" && rope_scaling != "llama3")
    return bad("--rope-scaling: none, linear or llama3");
  if (heads % kv_heads != 0) return bad("--heads must be a multiple of --kv-heads");
  const std::int32_t hd = head_dim > 0 ? head_dim : hidden / heads;
  if (head_dim == 0 && hidden % heads != 0) return bad("--hidden must be a multiple of --heads without --head-dim");
  if (eos >= vocab) return bad("--eos must be below --vocab");

  normal_stream rng{seed};
  std::vector<tensor> ts;
  const auto add = [&](const std::string& name, std::vector<std::int64_t> shape, double std_dev, double mean = 0.0) {
    tensor t{name, shape, {}};
    std::int64_t n = 1;
    for (const auto d : shape) n *= d;
    t.data.resize(static_cast<std::size_t>(n));
    for (float& x : t.data) x = static_cast<float>(mean + std_dev * rng());
    ts.push_back(std::move(t));
  };
  const std::int64_t H = hidden, Q = std::int64_t{heads} * hd, KV = std::int64_t{kv_heads} * hd, I = inter, V = vocab;
  add("model.embed_tokens.weight", {V, H}, 1.0);
  for (std::int32_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, 0.1, 1.0);
    add(p + "self_attn.q_proj.weight", {Q, H}, 1.0 / std::sqrt(double(H)));
    add(p + "self_attn.k_proj.weight", {KV, H}, 1.0 / std::sqrt(double(H)));
    add(p + "self_attn.v_proj.weight", {KV, H}, 1.0 / std::sqrt(double(H)));
    if (family == "qwen2") {
      add(p + "self_attn.q_proj.bias", {Q}, 0.1);
      add(p + "self_attn.k_proj.bias", {KV}, 0.1);
      add(p + "self_attn.v_proj.bias", {KV}, 0.1);
    }
    add(p + "self_attn.o_proj.weight", {H, Q}, 0.5 / std::sqrt(double(Q)));
    add(p + "post_attention_layernorm.weight", {H}, 0.1, 1.0);
    add(p + "mlp.gate_proj.weight", {I, H}, 1.0 / std::sqrt(double(H)));
    add(p + "mlp.up_proj.weight", {I, H}, 1.0 / std::sqrt(double(H)));
    add(p + "mlp.down_proj.weight", {H, I}, 0.5 / std::sqrt(double(I)));
  }
  add("model.norm.weight", {H}, 0.1, 1.0);
  if (!tie) add("lm_head.weight", {V, H}, 4.0 / std::sqrt(double(H)));

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return bad(dir + ": cannot create: " + ec.message());
  const std::string st = dtype == "f32" ? "F32" : dtype == "bf16" ? "BF16" : "F16";
  const std::string torch = dtype == "f32" ? "float32" : dtype == "bf16" ? "bfloat16" : "float16";
  nlohmann::ordered_json cfg;
  const std::string arch = family == "llama" ? "LlamaForCausalLM" : family == "qwen2" ? "Qwen2ForCausalLM" : "MistralForCausalLM";
  cfg["architectures"] = {arch};
  cfg["model_type"] = family;
  cfg["vocab_size"] = vocab;
  cfg["hidden_size"] = hidden;
  cfg["intermediate_size"] = inter;
  cfg["num_hidden_layers"] = layers;
  cfg["num_attention_heads"] = heads;
  cfg["num_key_value_heads"] = kv_heads;
  if (head_dim > 0) cfg["head_dim"] = head_dim;
  cfg["hidden_act"] = "silu";
  cfg["max_position_embeddings"] = max_pos;
  cfg["rms_norm_eps"] = 1e-6;
  cfg["tie_word_embeddings"] = tie;
  cfg["bos_token_id"] = 1 < vocab ? 1 : 0;
  cfg["eos_token_id"] = eos;
  cfg["attention_dropout"] = 0.0;
  if (family == "llama") cfg["attention_bias"] = false, cfg["mlp_bias"] = false;
  if (family == "mistral") cfg["sliding_window"] = window > 0 ? nlohmann::ordered_json(window) : nlohmann::ordered_json();
  if (family == "qwen2") {
    cfg["use_sliding_window"] = window > 0;
    cfg["sliding_window"] = window > 0 ? nlohmann::ordered_json(window) : nlohmann::ordered_json();
    cfg["max_window_layers"] = 0;
    if (!layer_types.empty()) {  // hybrid layers: sliding_attention and full_attention as listed
      nlohmann::ordered_json lt = nlohmann::ordered_json::array();
      for (std::size_t at = 0; at <= layer_types.size();) {
        const std::size_t comma = std::min(layer_types.find(',', at), layer_types.size());
        const std::string t = layer_types.substr(at, comma - at);
        if (t != "full" && t != "sliding") {
          std::fprintf(stderr, "kvpager-make-checkpoint: --layer-types: '%s' is not full or sliding\n", t.c_str());
          return kvtools::exit_bad_input;
        }
        lt.push_back(t == "full" ? "full_attention" : "sliding_attention");
        at = comma + 1;
      }
      if (lt.size() != static_cast<std::size_t>(layers) || window <= 0) {
        std::fprintf(stderr, "kvpager-make-checkpoint: --layer-types needs one entry per layer and --window\n");
        return kvtools::exit_bad_input;
      }
      cfg["layer_types"] = std::move(lt);
    }
  } else if (!layer_types.empty()) {
    std::fprintf(stderr, "kvpager-make-checkpoint: --layer-types is for --family qwen2\n");
    return kvtools::exit_bad_input;
  }
  nlohmann::ordered_json scaling;
  if (rope_scaling == "linear") scaling = {{"rope_type", "linear"}, {"factor", factor}};
  if (rope_scaling == "llama3")
    scaling = {{"rope_type", "llama3"}, {"factor", factor}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
               {"original_max_position_embeddings", std::max(1, max_pos / 4)}};
  if (format == 4) {
    cfg["rope_theta"] = theta;
    cfg["rope_scaling"] = scaling;
    cfg["torch_dtype"] = torch;
    cfg["transformers_version"] = "4.46.0";
  } else {
    nlohmann::ordered_json rp = scaling.is_null() ? nlohmann::ordered_json{{"rope_type", "default"}} : scaling;
    rp["rope_theta"] = theta;
    cfg["rope_parameters"] = rp;
    cfg["dtype"] = torch;
    cfg["transformers_version"] = "5.0.0";
  }
  std::ofstream(dir + "/config.json") << cfg.dump(2) << '\n';
  std::ofstream(dir + "/generation_config.json")
      << nlohmann::ordered_json{{"bos_token_id", cfg["bos_token_id"]}, {"eos_token_id", eos}}.dump(2) << '\n';
  std::filesystem::remove(dir + "/model.safetensors", ec);
  std::filesystem::remove(dir + "/model.safetensors.index.json", ec);
  if (shards == 1) {
    std::vector<const tensor*> all;
    for (const tensor& t : ts) all.push_back(&t);
    if (std::string e = write_file(dir + "/model.safetensors", all, st); !e.empty()) return bad(e);
  } else {
    nlohmann::ordered_json map;
    for (std::int32_t k = 0; k < shards; ++k) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, shards);
      std::vector<const tensor*> part;
      for (std::size_t i = static_cast<std::size_t>(k); i < ts.size(); i += static_cast<std::size_t>(shards)) {
        part.push_back(&ts[i]);
        map[ts[i].name] = name;
      }
      if (std::string e = write_file(dir + "/" + name, part, st); !e.empty()) return bad(e);
    }
    std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::ordered_json{{"metadata", nlohmann::ordered_json::object()}, {"weight_map", map}}.dump(2) << '\n';
  }
  std::printf("kvpager-make-checkpoint: %s: %s, %d layers, hidden %d, heads %d/%d x %d, vocab %d, %s%s\n", dir.c_str(),
              family.c_str(), layers, hidden, heads, kv_heads, hd, vocab, st.c_str(), window > 0 ? ", windowed" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvpager-make-checkpoint: %s\n", e.what());
    return 1;
  }
}
