// SPDX-License-Identifier: Apache-2.0
#pragma once
// A Hugging Face checkpoint directory: config.json (as transformers 4.x and 5.x write it), generation_config.json when
// present, and the weights in model.safetensors or in shards listed by model.safetensors.index.json. Every tensor the
// model needs is checked (present, dtype, shape against the config) before any is used; bf16 and fp16 weights are
// converted to fp32 once at load (4 bytes per parameter: model_weights::converted_bytes), fp32 weights are used in
// place from the mapped file. Errors name the file and the field or tensor.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <kvpager/kernels/float16.hpp>

#include "safetensors.hpp"

namespace kvgen {

/// RoPE's inverse-frequency rule (transformers' ROPE_INIT_FUNCTIONS: default, linear, llama3).
struct rope_config {
  enum class kind : std::uint8_t { plain, linear, llama3 };
  kind type = kind::plain;
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

/// The model's shape, from config.json.
struct model_config {
  std::string model_type;  ///< llama, qwen2, mistral, gemma2
  std::int32_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  std::int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::int32_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  rope_config rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  ///< q, k, v biases (qwen2 always); llama's attention_bias adds o_proj's too
  bool o_bias = false;
  bool mlp_bias = false;
  /// Gemma 2: the MLP's gelu (tanh approximation) instead of SiLU, norms of (1 + weight) around attention and MLP,
  /// the embedding scaled by sqrt(hidden_size), and the soft caps.
  bool gemma = false;
  bool gelu_tanh = false;           ///< hidden_activation gelu_pytorch_tanh (else silu)
  double attn_scale = 0;            ///< the attention's score scale: 1/sqrt(head_dim), or query_pre_attn_scalar^-1/2
  double attn_softcap = 0;          ///< attn_logit_softcapping (0: off): score = cap * tanh(score / cap)
  double final_softcap = 0;         ///< final_logit_softcapping (0: off), on the LM head's logits
  /// Per layer: -1 full attention, w >= 0 the kernels' window_left (the query sees its last w + 1 positions: a
  /// transformers sliding window of w + 1 tokens).
  std::vector<std::int32_t> window_left;
  std::vector<std::int32_t> eos_ids;
  std::string dtype;  ///< torch_dtype / dtype as written (informational)
};

/// One decoder layer's weights, fp32, row-major [out, in] as Hugging Face stores nn.Linear.
struct layer_weights {
  const float *input_norm = nullptr, *post_norm = nullptr;  ///< before attention, before the MLP
  const float *attn_out_norm = nullptr, *mlp_out_norm = nullptr;  ///< Gemma 2: on the attention's and MLP's outputs
  const float *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;
  const float *w_gate = nullptr, *w_up = nullptr, *w_down = nullptr;
  const float *b_gate = nullptr, *b_up = nullptr, *b_down = nullptr;
};

/// The loaded model: its config, its tensors (mapped files and fp32 copies of converted ones).
struct model_weights {
  model_config config;
  const float* embed = nullptr;    ///< [vocab, hidden]
  const float* norm = nullptr;     ///< [hidden]
  const float* lm_head = nullptr;  ///< [vocab, hidden] (embed when tied)
  std::vector<layer_weights> layers;
  std::int64_t mapped_bytes = 0;     ///< bytes of the mapped safetensors files
  std::int64_t converted_bytes = 0;  ///< bytes of fp32 copies made at load (bf16/fp16 weights, unaligned fp32)
  std::int64_t parameters = 0;
  std::vector<safetensors_file> files;
  std::vector<std::unique_ptr<float[]>> owned;
};

namespace detail {

inline std::string read_text(const std::string& path, std::string& err) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    err = path + ": cannot open";
    return {};
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A JSON object from a file; "" or the error naming the file.
inline std::string load_json(const std::string& path, nlohmann::json& out) {
  std::string err;
  const std::string text = read_text(path, err);
  if (!err.empty()) return err;
  out = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) return path + ": not valid JSON";
  if (!out.is_object()) return path + ": not a JSON object";
  return "";
}

/// Field readers: "" or an error naming the file and field.
struct fields {
  const nlohmann::json& j;
  std::string file;

  [[nodiscard]] bool has(const char* k) const { return j.contains(k) && !j.at(k).is_null(); }
  std::string positive(const char* k, std::int32_t& out, bool required = true) const {
    if (!has(k)) return required ? file + ": required field '" + k + "' is missing" : "";
    const auto& v = j.at(k);
    if (!v.is_number_integer()) return file + ": field '" + k + "' is not an integer";
    const auto x = v.get<std::int64_t>();
    if (x <= 0 || x > INT32_MAX) return file + ": field '" + k + "' must be a positive 32-bit integer, not " + v.dump();
    out = static_cast<std::int32_t>(x);
    return "";
  }
  std::string number(const nlohmann::json& o, const char* k, double& out, bool required, const std::string& where) const {
    if (!o.contains(k) || o.at(k).is_null()) return required ? file + ": required field '" + where + k + "' is missing" : "";
    const auto& v = o.at(k);
    if (!v.is_number()) return file + ": field '" + where + k + "' is not a number";
    out = v.get<double>();
    if (!std::isfinite(out) || out <= 0) return file + ": field '" + where + k + "' must be a positive number";
    return "";
  }
  std::string boolean(const char* k, bool& out) const {
    if (!has(k)) return "";
    if (!j.at(k).is_boolean()) return file + ": field '" + k + "' is not a boolean";
    out = j.at(k).get<bool>();
    return "";
  }
};

/// eos_token_id: an integer or a list of them.
inline std::string eos_list(const nlohmann::json& v, const std::string& where, std::vector<std::int32_t>& out) {
  out.clear();
  if (v.is_null()) return "";
  const auto one = [&](const nlohmann::json& x) -> bool {
    if (!x.is_number_integer() || x.get<std::int64_t>() < 0 || x.get<std::int64_t>() > INT32_MAX) return false;
    out.push_back(static_cast<std::int32_t>(x.get<std::int64_t>()));
    return true;
  };
  if (v.is_array()) {
    for (const auto& x : v)
      if (!one(x)) return where + ": eos_token_id must hold non-negative integers";
    return "";
  }
  if (!one(v)) return where + ": eos_token_id must be a non-negative integer or a list of them";
  return "";
}

}  // namespace detail

/// Parses config.json (and generation_config.json beside it when present). Returns "" or the error.
inline std::string parse_config(const std::string& dir, model_config& c) {
  const std::string path = dir + "/config.json";
  nlohmann::json j;
  if (std::string e = detail::load_json(path, j); !e.empty()) return e;
  const detail::fields f{j, path};
  if (!j.contains("model_type") || !j.at("model_type").is_string())
    return path + ": required field 'model_type' is missing or not a string";
  c.model_type = j.at("model_type").get<std::string>();
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "mistral" && c.model_type != "gemma2")
    return path + ": model_type '" + c.model_type + "' is not supported (llama, qwen2, mistral, gemma2)";
  c.gemma = c.model_type == "gemma2";
  for (const auto& [k, out] : {std::pair<const char*, std::int32_t*>{"vocab_size", &c.vocab_size},
                               {"hidden_size", &c.hidden_size},
                               {"intermediate_size", &c.intermediate_size},
                               {"num_hidden_layers", &c.num_layers},
                               {"num_attention_heads", &c.num_heads}})
    if (std::string e = f.positive(k, *out); !e.empty()) return e;
  c.num_kv_heads = c.num_heads;
  if (std::string e = f.positive("num_key_value_heads", c.num_kv_heads, false); !e.empty()) return e;
  if (c.num_heads % c.num_kv_heads != 0)
    return path + ": num_attention_heads (" + std::to_string(c.num_heads) + ") is not a multiple of num_key_value_heads (" +
           std::to_string(c.num_kv_heads) + ")";
  if (f.has("head_dim")) {
    if (std::string e = f.positive("head_dim", c.head_dim); !e.empty()) return e;
  } else {
    if (c.hidden_size % c.num_heads != 0)
      return path + ": hidden_size is not a multiple of num_attention_heads and no head_dim is given";
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2 != 0) return path + ": head_dim " + std::to_string(c.head_dim) + " is odd (RoPE needs pairs)";
  c.max_position_embeddings = c.model_type == "llama"   ? 2048
                              : c.model_type == "qwen2" ? 32768
                              : c.gemma                 ? 8192
                                                        : 131072;
  if (std::string e = f.positive("max_position_embeddings", c.max_position_embeddings, false); !e.empty()) return e;
  if (f.has("rms_norm_eps")) {
    const auto& v = j.at("rms_norm_eps");
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      return path + ": field 'rms_norm_eps' must be a positive number";
    c.rms_norm_eps = v.get<double>();
  }
  // The MLP's activation: silu (Llama, Qwen2, Mistral), gelu_pytorch_tanh (Gemma 2's hidden_activation, its
  // default; a hidden_act beside it is what older configs carry and transformers ignores for Gemma 2).
  c.gelu_tanh = c.gemma;
  for (const char* k : {"hidden_act", "hidden_activation"}) {
    if (!f.has(k) || (c.gemma && std::string(k) == "hidden_act" && f.has("hidden_activation"))) continue;
    const std::string act = j.at(k).is_string() ? j.at(k).get<std::string>() : "";
    if (act != (c.gemma ? "gelu_pytorch_tanh" : "silu"))
      return path + ": " + k + " " + j.at(k).dump() + " is not supported (" +
             (c.gemma ? "gelu_pytorch_tanh" : "silu") + ")";
  }
  if (f.has("pretraining_tp") && !(j.at("pretraining_tp").is_number_integer() && j.at("pretraining_tp").get<int>() == 1))
    return path + ": pretraining_tp " + j.at("pretraining_tp").dump() + " is not supported (1)";
  c.tie_word_embeddings = c.gemma;  // Gemma2Config's default
  if (std::string e = f.boolean("tie_word_embeddings", c.tie_word_embeddings); !e.empty()) return e;
  c.attn_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  if (c.gemma) {
    double qpas = 256;  // Gemma2Config's default query_pre_attn_scalar
    if (std::string e = f.number(j, "query_pre_attn_scalar", qpas, false, ""); !e.empty()) return e;
    c.attn_scale = 1.0 / std::sqrt(qpas);
    c.attn_softcap = 50.0;  // the defaults; null turns a cap off
    c.final_softcap = 30.0;
    for (const auto& [k, out] : {std::pair<const char*, double*>{"attn_logit_softcapping", &c.attn_softcap},
                                 {"final_logit_softcapping", &c.final_softcap}}) {
      if (!j.contains(k)) continue;
      if (j.at(k).is_null()) {
        *out = 0;
      } else if (std::string e = f.number(j, k, *out, true, ""); !e.empty()) {
        return e;
      }
    }
  }
  if (c.model_type == "qwen2") {
    c.attention_bias = true;
  } else if (c.model_type == "llama" || c.gemma) {
    if (std::string e = f.boolean("attention_bias", c.attention_bias); !e.empty()) return e;
    c.o_bias = c.attention_bias;
    if (std::string e = f.boolean("mlp_bias", c.mlp_bias); !e.empty()) return e;
  }
  for (const char* k : {"torch_dtype", "dtype"})
    if (f.has(k) && j.at(k).is_string()) c.dtype = j.at(k).get<std::string>();

  // RoPE: transformers 4.x writes rope_theta and rope_scaling, 5.x rope_parameters (rope_type, rope_theta, ...).
  const nlohmann::json* scaling = nullptr;
  std::string where;
  if (f.has("rope_parameters")) {
    if (!j.at("rope_parameters").is_object()) return path + ": field 'rope_parameters' is not an object";
    scaling = &j.at("rope_parameters");
    where = "rope_parameters.";
    if (std::string e = f.number(*scaling, "rope_theta", c.rope.theta, false, where); !e.empty()) return e;
  } else if (f.has("rope_scaling")) {
    if (!j.at("rope_scaling").is_object()) return path + ": field 'rope_scaling' is not an object";
    scaling = &j.at("rope_scaling");
    where = "rope_scaling.";
  }
  if (f.has("rope_theta") && where != "rope_parameters.")
    if (std::string e = f.number(j, "rope_theta", c.rope.theta, false, ""); !e.empty()) return e;
  if (scaling != nullptr) {
    std::string type = "default";
    for (const char* k : {"rope_type", "type"})
      if (scaling->contains(k) && scaling->at(k).is_string()) type = scaling->at(k).get<std::string>();
    if (type == "default") {
      c.rope.type = rope_config::kind::plain;
    } else if (type == "linear") {
      c.rope.type = rope_config::kind::linear;
      if (std::string e = f.number(*scaling, "factor", c.rope.factor, true, where); !e.empty()) return e;
    } else if (type == "llama3") {
      c.rope.type = rope_config::kind::llama3;
      if (std::string e = f.number(*scaling, "factor", c.rope.factor, true, where); !e.empty()) return e;
      if (std::string e = f.number(*scaling, "low_freq_factor", c.rope.low_freq_factor, true, where); !e.empty()) return e;
      if (std::string e = f.number(*scaling, "high_freq_factor", c.rope.high_freq_factor, true, where); !e.empty()) return e;
      if (std::string e = f.number(*scaling, "original_max_position_embeddings",
                                   c.rope.original_max_position_embeddings, true, where);
          !e.empty())
        return e;
      if (!(c.rope.high_freq_factor > c.rope.low_freq_factor))
        return path + ": " + where + "high_freq_factor must be above low_freq_factor";
    } else {
      return path + ": " + where + "rope_type '" + type + "' is not supported (default, linear, llama3)";
    }
    if (scaling->contains("partial_rotary_factor") && !scaling->at("partial_rotary_factor").is_null() &&
        !(scaling->at("partial_rotary_factor").is_number() && scaling->at("partial_rotary_factor").get<double>() == 1.0))
      return path + ": " + where + "partial_rotary_factor other than 1 is not supported";
  }
  if (f.has("partial_rotary_factor") &&
      !(j.at("partial_rotary_factor").is_number() && j.at("partial_rotary_factor").get<double>() == 1.0))
    return path + ": partial_rotary_factor other than 1 is not supported";

  // Sliding windows: mistral's sliding_window applies to every layer; qwen2's to layers >= max_window_layers when
  // use_sliding_window; gemma2's to the even layers (0, 2, ...); an explicit layer_types list decides where given.
  std::int32_t window = 0;
  bool windowed = false;
  if (f.has("sliding_window")) {
    if (std::string e = f.positive("sliding_window", window); !e.empty()) return e;
    windowed = c.model_type == "mistral" || c.gemma;
    if (c.model_type == "qwen2") {
      bool use = false;
      if (std::string e = f.boolean("use_sliding_window", use); !e.empty()) return e;
      windowed = use;
    }
  }
  std::int32_t max_window_layers = 28;  // transformers' Qwen2Config default
  if (c.model_type == "qwen2" && f.has("max_window_layers")) {
    const auto& mw = j.at("max_window_layers");
    if (!mw.is_number_integer() || mw.get<std::int64_t>() < 0 || mw.get<std::int64_t>() > INT32_MAX)
      return path + ": field 'max_window_layers' must be a non-negative integer";
    max_window_layers = static_cast<std::int32_t>(mw.get<std::int64_t>());
  }
  c.window_left.assign(static_cast<std::size_t>(c.num_layers), -1);
  if (f.has("layer_types")) {
    const auto& lt = j.at("layer_types");
    if (!lt.is_array() || lt.size() != static_cast<std::size_t>(c.num_layers))
      return path + ": layer_types must be a list of num_hidden_layers entries";
    for (std::size_t i = 0; i < lt.size(); ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t == "sliding_attention") {
        if (window <= 0) return path + ": layer_types names a sliding_attention layer but sliding_window is not set";
        c.window_left[i] = window - 1;
      } else if (t != "full_attention") {
        return path + ": layer_types[" + std::to_string(i) + "] " + lt[i].dump() +
               " is not supported (full_attention, sliding_attention)";
      }
    }
  } else if (windowed) {
    for (std::int32_t i = 0; i < c.num_layers; ++i)
      if (c.model_type == "mistral" || (c.gemma ? i % 2 == 0 : i >= max_window_layers))
        c.window_left[static_cast<std::size_t>(i)] = window - 1;
  }

  if (j.contains("eos_token_id"))
    if (std::string e = detail::eos_list(j.at("eos_token_id"), path, c.eos_ids); !e.empty()) return e;
  const std::string gen = dir + "/generation_config.json";
  if (std::ifstream(gen).good()) {
    nlohmann::json g;
    if (std::string e = detail::load_json(gen, g); !e.empty()) return e;
    if (g.contains("eos_token_id"))
      if (std::string e = detail::eos_list(g.at("eos_token_id"), gen, c.eos_ids); !e.empty()) return e;
  }
  for (const std::int32_t e : c.eos_ids)
    if (e >= c.vocab_size) return path + ": eos_token_id " + std::to_string(e) + " is outside the vocabulary";
  return "";
}

namespace detail {

/// The tensor `name` with `shape`, as fp32 (converted once when stored in bf16/fp16, or when unaligned).
inline std::string take(model_weights& m, const std::map<std::string, const st_tensor*>& all, const std::string& name,
                        std::vector<std::int64_t> shape, const float*& out) {
  const auto it = all.find(name);
  if (it == all.end()) return "missing tensor '" + name + "'";
  const st_tensor& t = *it->second;
  if (t.shape != shape) {
    auto dims = [](const std::vector<std::int64_t>& s) {
      std::string r = "[";
      for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
      return r + "]";
    };
    return "tensor '" + name + "' has shape " + dims(t.shape) + ", the config says " + dims(shape);
  }
  const auto n = static_cast<std::size_t>(t.numel());
  m.parameters += static_cast<std::int64_t>(n);
  if (t.dtype == st_dtype::f32 && reinterpret_cast<std::uintptr_t>(t.data) % alignof(float) == 0) {
    out = reinterpret_cast<const float*>(t.data);
    return "";
  }
  std::unique_ptr<float[]> buf(new float[n]);
  for (std::size_t i = 0; i < n; ++i) {
    if (t.dtype == st_dtype::f32) {
      std::memcpy(&buf[i], t.data + i * 4, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, t.data + i * 2, 2);
      buf[i] = t.dtype == st_dtype::bf16 ? kvpager::detail::bf16_to_float(h) : kvpager::detail::half_to_float(h);
    }
  }
  m.converted_bytes += static_cast<std::int64_t>(n * sizeof(float));
  out = buf.get();
  m.owned.push_back(std::move(buf));
  return "";
}

}  // namespace detail

/// Loads the checkpoint in `dir` into `m`. Returns "" or the error (naming the file, field or tensor).
inline std::string load_checkpoint(const std::string& dir, model_weights& m) {
  m = model_weights{};
  if (std::string e = parse_config(dir, m.config); !e.empty()) return e;
  const model_config& c = m.config;
  // The files: one model.safetensors, or the shards of model.safetensors.index.json.
  std::vector<std::string> names;
  std::map<std::string, std::string> weight_map;
  const std::string index = dir + "/model.safetensors.index.json";
  if (std::ifstream(index).good()) {
    nlohmann::json j;
    if (std::string e = detail::load_json(index, j); !e.empty()) return e;
    if (!j.contains("weight_map") || !j.at("weight_map").is_object())
      return index + ": required field 'weight_map' is missing or not an object";
    for (const auto& [k, v] : j.at("weight_map").items()) {
      if (!v.is_string()) return index + ": weight_map['" + k + "'] is not a file name";
      const std::string file = v.get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
        return index + ": weight_map['" + k + "'] names '" + file + "', not a file beside the index";
      weight_map[k] = file;
      if (std::find(names.begin(), names.end(), file) == names.end()) names.push_back(file);
    }
  } else {
    names.push_back("model.safetensors");
  }
  std::map<std::string, const st_tensor*> all;
  m.files.reserve(names.size());
  for (const std::string& n : names) {
    safetensors_file f;
    if (std::string e = f.open(dir + "/" + n); !e.empty()) return e;
    m.mapped_bytes += static_cast<std::int64_t>(f.mapped_bytes());
    m.files.push_back(std::move(f));
  }
  for (const safetensors_file& f : m.files)
    for (const st_tensor& t : f.tensors()) {
      if (!all.emplace(t.name, &t).second) return f.path() + ": tensor '" + t.name + "' is also in another shard";
      if (!weight_map.empty()) {
        const auto w = weight_map.find(t.name);
        const std::string base = f.path().substr(f.path().rfind('/') + 1);
        if (w == weight_map.end() || w->second != base)
          return f.path() + ": tensor '" + t.name + "' is not mapped to this file by " + index;
      }
    }
  for (const auto& [k, file] : weight_map)
    if (all.find(k) == all.end()) return index + ": tensor '" + k + "' is not in " + file;

  const std::int64_t h = c.hidden_size, q = std::int64_t{c.num_heads} * c.head_dim,
                     kv = std::int64_t{c.num_kv_heads} * c.head_dim, inter = c.intermediate_size, v = c.vocab_size;
  auto take = [&](const std::string& name, std::vector<std::int64_t> shape, const float*& out) {
    std::string e = detail::take(m, all, name, std::move(shape), out);
    return e.empty() ? e : dir + ": " + e;
  };
  if (std::string e = take("model.embed_tokens.weight", {v, h}, m.embed); !e.empty()) return e;
  if (std::string e = take("model.norm.weight", {h}, m.norm); !e.empty()) return e;
  if (c.tie_word_embeddings && all.find("lm_head.weight") == all.end()) {
    m.lm_head = m.embed;
  } else if (std::string e = take("lm_head.weight", {v, h}, m.lm_head); !e.empty()) {
    return e;
  }
  m.layers.resize(static_cast<std::size_t>(c.num_layers));
  for (std::int32_t i = 0; i < c.num_layers; ++i) {
    layer_weights& L = m.layers[static_cast<std::size_t>(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    struct want {
      const char* name;
      std::vector<std::int64_t> shape;
      const float** out;
      bool needed;
    };
    const want ws[] = {
        {"input_layernorm.weight", {h}, &L.input_norm, true},
        {"post_attention_layernorm.weight", {h}, c.gemma ? &L.attn_out_norm : &L.post_norm, true},
        {"pre_feedforward_layernorm.weight", {h}, &L.post_norm, c.gemma},
        {"post_feedforward_layernorm.weight", {h}, &L.mlp_out_norm, c.gemma},
        {"self_attn.q_proj.weight", {q, h}, &L.wq, true},
        {"self_attn.k_proj.weight", {kv, h}, &L.wk, true},
        {"self_attn.v_proj.weight", {kv, h}, &L.wv, true},
        {"self_attn.o_proj.weight", {h, q}, &L.wo, true},
        {"self_attn.q_proj.bias", {q}, &L.bq, c.attention_bias},
        {"self_attn.k_proj.bias", {kv}, &L.bk, c.attention_bias},
        {"self_attn.v_proj.bias", {kv}, &L.bv, c.attention_bias},
        {"self_attn.o_proj.bias", {h}, &L.bo, c.o_bias},
        {"mlp.gate_proj.weight", {inter, h}, &L.w_gate, true},
        {"mlp.up_proj.weight", {inter, h}, &L.w_up, true},
        {"mlp.down_proj.weight", {h, inter}, &L.w_down, true},
        {"mlp.gate_proj.bias", {inter}, &L.b_gate, c.mlp_bias},
        {"mlp.up_proj.bias", {inter}, &L.b_up, c.mlp_bias},
        {"mlp.down_proj.bias", {h}, &L.b_down, c.mlp_bias},
    };
    for (const want& w : ws)
      if (w.needed)
        if (std::string e = take(p + w.name, w.shape, *w.out); !e.empty()) return e;
  }
  if (c.gemma) {  // Gemma's RMSNorm scales by (1 + weight): the norms become fp32 copies of 1 + weight, once
    const auto one_plus = [&](const float*& w) {
      std::unique_ptr<float[]> buf(new float[static_cast<std::size_t>(h)]);
      for (std::int64_t i = 0; i < h; ++i) buf[static_cast<std::size_t>(i)] = 1.0F + w[i];
      m.converted_bytes += h * static_cast<std::int64_t>(sizeof(float));
      w = buf.get();
      m.owned.push_back(std::move(buf));
    };
    one_plus(m.norm);
    for (layer_weights& L : m.layers)
      for (const float** w : {&L.input_norm, &L.post_norm, &L.attn_out_norm, &L.mlp_out_norm}) one_plus(*w);
  }
  return "";
}

}  // namespace kvgen
