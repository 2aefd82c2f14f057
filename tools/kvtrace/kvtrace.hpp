// SPDX-License-Identifier: Apache-2.0
#pragma once
// kvtrace reader: parses a kvtrace file (format in docs/KVTRACE.md) into typed records, or reports the first
// problem as "FILE:LINE: message". Never throws on bad input, never loops on it. Every record it accepts is valid
// UTF-8 and every param is in range at its own line, so what it returns can be echoed as JSON and replayed.

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <ios>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include <kvpager/groups/vllm_hit.hpp>

namespace kvreplay {

enum class op_kind { alloc, free, req, admit, decode, finish, run, fork };

/// How `run` preempts (kvtrace extension `param preemption recompute|swap|hybrid`).
enum class preemption_mode { recompute, swap, hybrid };

/// One prompt segment `seed:len`.
struct segment {
  std::uint64_t seed = 0;
  std::int64_t len = 0;
};

/// One op record. Fields used depend on the kind: alloc (id, n), free (id), req (id, gen_seed, max_new,
/// segments), admit/finish (id), decode (id, n), run (n = max_steps), fork (id = parent, child, gen_seed).
struct op {
  op_kind kind{};
  std::int64_t line = 0;
  std::uint64_t id = 0;
  std::int64_t n = 0;
  std::uint64_t gen_seed = 0;
  std::int64_t max_new = 0;
  std::vector<segment> segments;
  std::uint64_t child = 0;
};

/// A `group` header record (KVTRACE.md, "Hybrid KV cache groups"): a KV cache group, in vLLM's group order.
struct group_record {
  std::string kind;       // "full", "sliding_window" or "chunked_local"
  std::int64_t size = 0;  // the window or chunk in tokens (0 for full)
  std::string text;       // as written without the word `group`, fields joined by one space ("sliding_window 128")
  std::int64_t line = 0;
};

struct trace {
  std::string workload;
  std::string level;  // "pool" or "manager"
  std::vector<std::pair<std::string, std::int64_t>> params;  // integer params, in order
  std::vector<std::pair<std::string, std::string>> raw_params;  // every param as written, in order (for echoing)
  std::vector<std::int64_t> raw_param_lines;  // the line of each raw_params entry
  preemption_mode preemption = preemption_mode::recompute;
  std::vector<group_record> groups;  // none: one full-attention group, today's semantics
  std::vector<op> ops;

  /// The value of param `key`, or `fallback`.
  [[nodiscard]] std::int64_t param(std::string_view key, std::int64_t fallback) const {
    for (const auto& [k, v] : params)
      if (k == key) return v;
    return fallback;
  }
  [[nodiscard]] bool has_param(std::string_view key) const {
    for (const auto& [k, v] : params)
      if (k == key) return true;
    return false;
  }
  /// The line of the `param` record for `key`, or 0 when the trace has none.
  [[nodiscard]] std::int64_t param_line(std::string_view key) const {
    for (std::size_t i = 0; i < raw_params.size() && i < raw_param_lines.size(); ++i)
      if (raw_params[i].first == key) return raw_param_lines[i];
    return 0;
  }
};

/// Parse outcome: a trace, or an error message naming the line.
struct parse_result {
  std::optional<trace> value;
  std::string error;
};

namespace detail {

inline std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\v' || line[i] == '\f')) ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r' && line[j] != '\v' && line[j] != '\f') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

/// A non-negative decimal integer with no sign, no junk, and no overflow.
template <class T>
inline bool parse_uint(std::string_view s, T& out) {
  if (s.empty() || s.size() > 20) return false;
  for (char ch : s)
    if (ch < '0' || ch > '9') return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size();
}

/// Offset of the first byte of `s` that is not part of well-formed UTF-8 (RFC 3629: no overlong forms, no
/// surrogates, nothing above U+10FFFF), or npos when all of `s` is. O(size).
[[nodiscard]] inline std::size_t invalid_utf8_at(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte (the first continuation byte), per RFC 3629's table.
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // UTF-16 surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;  // a continuation byte, C0/C1 (overlong) or F5..FF
    }
    if (s.size() - i < len) return i;
    for (std::size_t k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

/// The range rule of a known integer param, checked at its `param` line: nullptr when `value` is allowed,
/// else the message. Unknown keys take any value (they are echoed, not used).
[[nodiscard]] inline const char* param_range_error(std::string_view key, std::int64_t value) noexcept {
  constexpr std::int64_t max_blocks = std::int64_t{1} << 24;
  if (key == "num_blocks" && (value < 2 || value > max_blocks)) return "num_blocks must be in [2, 2^24]";
  if (key == "block_size" && (value < 1 || value > 4096 || (value & (value - 1)) != 0))
    return "block_size must be a power of two <= 4096";
  if (key == "enable_caching" && value > 1) return "enable_caching must be 0 or 1";
  if (key == "max_num_seqs" && value < 1) return "max_num_seqs must be positive";
  if (key == "max_num_batched_tokens" && value < 1) return "max_num_batched_tokens must be positive";
  if (key == "watermark_permille" && value > 1000) return "watermark_permille must be in [0, 1000]";
  if (key == "num_host_blocks" && value > max_blocks) return "num_host_blocks must be <= 2^24";
  return nullptr;
}

}  // namespace detail

/// Outcome of reading a trace file: its bytes, or an I/O error ("cannot read FILE: why").
struct read_result {
  std::optional<std::string> text;
  std::string error;
};

/// Reads the trace file at `path` whole. Only a regular file (or a link to one) is read: a directory, a FIFO, a
/// device or a socket is an I/O error, as is a path that cannot be opened or a read that fails, so neither an empty
/// read nor an endless stream (/dev/zero) is taken for a trace. Never throws on a bad path (std::bad_alloc aside).
inline read_result read_trace_file(const std::string& path) {
  read_result res;
  auto fail = [&](const std::string& why) {
    res.error = "cannot read " + path + ": " + why;
    return res;
  };
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec) return fail(ec.message());
  if (st.type() == std::filesystem::file_type::directory) return fail("is a directory");
  if (st.type() != std::filesystem::file_type::regular) return fail("not a regular file");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(errno != 0 ? std::generic_category().message(errno) : "cannot open it");
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) text.append(buf, static_cast<std::size_t>(in.gcount()));
  if (in.bad() || !in.eof()) return fail("read error");
  res.text = std::move(text);
  return res;
}

/// Parses kvtrace text. `name` is used in error messages.
inline parse_result parse_kvtrace(std::string_view text, const std::string& name) {
  parse_result res;
  trace t;
  std::int64_t line_no = 0;
  bool seen_magic = false, seen_op = false;
  auto fail = [&](const std::string& msg) {
    res.error = name + ":" + std::to_string(line_no) + ": " + msg;
    return res;
  };
  std::size_t pos = 0;
  std::unordered_set<std::uint64_t> defined;  // request ids seen in 'req'
  // Checks that need the whole header (each param's own range is checked at its line). A missing record is
  // reported at the line that ends the header (the first op, or the end of the file); a conflict at its param.
  auto header_complete = [&](const char* where) {
    if (t.level.empty()) {
      fail(std::string("missing 'level' record") + where);
      return false;
    }
    if (!t.has_param("num_blocks")) {
      fail(std::string("missing 'param num_blocks'") + where);
      return false;
    }
    if (!t.groups.empty()) {
      std::vector<kvpager::vllm_kind> kinds;
      for (const group_record& g : t.groups)
        kinds.push_back(g.kind == "full"             ? kvpager::vllm_kind{kvpager::vllm_kind_tag::full, 0}
                        : g.kind == "sliding_window" ? kvpager::vllm_kind{kvpager::vllm_kind_tag::sliding_window, g.size}
                                                     : kvpager::vllm_kind{kvpager::vllm_kind_tag::chunked_local, g.size});
      if (const kvpager::status st = kvpager::check_vllm_layout(kinds); !st) {
        const auto at = static_cast<std::size_t>(std::max<std::int64_t>(st.detail(), 0));
        line_no = t.groups[std::min(at, t.groups.size() - 1)].line;
        fail(std::string("invalid group layout: ") + st.message() + " (KVTRACE.md: only layouts vLLM's layer grouping can produce)");
        return false;
      }
    }
    if (t.preemption != preemption_mode::recompute && t.param("num_host_blocks", 0) < 1) {
      line_no = t.param_line("preemption");
      fail("'param preemption swap|hybrid' needs 'param num_host_blocks' > 0");
      return false;
    }
    return true;
  };

  while (pos <= text.size()) {
    const std::size_t eol = text.find('\n', pos);
    std::string_view line = text.substr(pos, eol == std::string_view::npos ? std::string_view::npos : eol - pos);
    pos = eol == std::string_view::npos ? text.size() + 1 : eol + 1;
    ++line_no;
    if (const std::size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    if (line.find('\0') != std::string_view::npos) return fail("NUL byte in the line");
    // Every field is stored or echoed as text (JSON needs UTF-8), so the record is checked whole; comments are not.
    if (const std::size_t bad = detail::invalid_utf8_at(line); bad != std::string_view::npos) {
      static constexpr char hex[] = "0123456789ABCDEF";
      const auto b = static_cast<unsigned char>(line[bad]);
      return fail(std::string("invalid UTF-8 (byte 0x") + hex[b >> 4] + hex[b & 15] + " at column " +
                  std::to_string(bad + 1) + ")");
    }
    const auto f = detail::split_fields(line);
    if (f.empty()) continue;
    const std::string_view kw = f[0];
    auto need = [&](std::size_t n) { return f.size() == n; };
    if (!seen_magic) {
      if (kw != "kvtrace") return fail("expected 'kvtrace 1' as the first record");
      if (!need(2) || f[1] != "1") return fail("unsupported kvtrace version (expected 'kvtrace 1')");
      seen_magic = true;
      continue;
    }
    if (kw == "kvtrace") return fail("duplicate 'kvtrace' record");
    if (kw == "group") {
      if (seen_op) return fail("header record 'group' after the first op");
      if (t.level.empty()) return fail("'group' record before 'level' (groups are for level manager traces)");
      if (t.level == "pool") return fail("'group' record in a level pool trace (groups are for level manager traces)");
      if (t.groups.size() >= 64) return fail("more than 64 'group' records");
      group_record g;
      g.line = line_no;
      if (f.size() < 2) return fail("'group' takes a kind: full, sliding_window W or chunked_local C");
      g.kind = std::string(f[1]);
      if (g.kind == "full") {
        if (!need(2)) return fail("'group full' takes no size");
      } else if (g.kind == "sliding_window" || g.kind == "chunked_local") {
        const char* what = g.kind == "sliding_window" ? "window" : "chunk";
        if (!need(3)) return fail("'group " + g.kind + "' takes one size (the " + what + " in tokens)");
        if (!detail::parse_uint(f[2], g.size)) return fail("bad number '" + std::string(f[2]) + "' for the " + what);
        if (g.size < 1) return fail(std::string("the ") + what + " of 'group " + g.kind + "' must be at least 1");
        if (g.size > (std::int64_t{1} << 30)) return fail(std::string("the ") + what + " is out of range (at most 2^30)");
      } else {
        return fail("unknown group kind '" + g.kind + "' (full, sliding_window W or chunked_local C)");
      }
      g.text = g.kind + (g.kind == "full" ? "" : " " + std::to_string(g.size));
      t.groups.push_back(std::move(g));
      continue;
    }
    if (kw == "workload" || kw == "level" || kw == "param") {
      if (seen_op) return fail("header record '" + std::string(kw) + "' after the first op");
      if (kw == "workload") {
        if (!need(2)) return fail("'workload' takes one name");
        t.workload = std::string(f[1]);
      } else if (kw == "level") {
        if (!need(2) || (f[1] != "pool" && f[1] != "manager")) return fail("'level' must be 'pool' or 'manager'");
        if (!t.groups.empty()) return fail("'level' record after a 'group' record");
        t.level = std::string(f[1]);
      } else if (need(3) && f[1] == "preemption") {
        if (f[2] == "recompute") {
          t.preemption = preemption_mode::recompute;
        } else if (f[2] == "swap") {
          t.preemption = preemption_mode::swap;
        } else if (f[2] == "hybrid") {
          t.preemption = preemption_mode::hybrid;
        } else {
          return fail("'param preemption' must be recompute, swap or hybrid");
        }
        for (const auto& [k, v] : t.raw_params)
          if (k == "preemption") return fail("duplicate param preemption");
        t.raw_params.emplace_back("preemption", std::string(f[2]));
        t.raw_param_lines.push_back(line_no);
      } else {
        if (!need(3)) return fail("'param' takes a key and an integer");
        std::int64_t v = 0;
        if (!detail::parse_uint(f[2], v)) return fail("bad number '" + std::string(f[2]) + "' for param " + std::string(f[1]));
        if (t.has_param(f[1])) return fail("duplicate param " + std::string(f[1]));
        if (const char* why = detail::param_range_error(f[1], v)) return fail(why);
        t.params.emplace_back(std::string(f[1]), v);
        t.raw_params.emplace_back(std::string(f[1]), std::string(f[2]));
        t.raw_param_lines.push_back(line_no);
      }
      continue;
    }
    if (!seen_op) {
      seen_op = true;
      if (!header_complete(" before the first op")) return res;
    }
    op o;
    o.line = line_no;
    auto num = [&](std::size_t i, auto& out, const char* what) -> bool {
      if (!detail::parse_uint(f[i], out)) {
        res.error = name + ":" + std::to_string(line_no) + ": bad number '" + std::string(f[i]) + "' for " + what;
        return false;
      }
      return true;
    };
    const bool pool = t.level == "pool";
    if (kw == "alloc" || kw == "free") {
      if (!pool) return fail("'" + std::string(kw) + "' is a pool-level op; this trace is level manager");
      if (kw == "alloc") {
        if (!need(3)) return fail("'alloc' takes a slot id and a block count");
        o.kind = op_kind::alloc;
        if (!num(1, o.id, "slot id") || !num(2, o.n, "block count")) return res;
        if (o.n < 1 || o.n > (std::int64_t{1} << 30)) return fail("block count out of range");
      } else {
        if (!need(2)) return fail("'free' takes a slot id");
        o.kind = op_kind::free;
        if (!num(1, o.id, "slot id")) return res;
      }
    } else if (kw == "req" || kw == "admit" || kw == "decode" || kw == "finish" || kw == "run" || kw == "fork") {
      if (pool) return fail("'" + std::string(kw) + "' is a manager-level op; this trace is level pool");
      if (kw == "req") {
        if (f.size() < 5) return fail("'req' takes an id, a gen seed, max_new and at least one seed:len segment");
        o.kind = op_kind::req;
        if (!num(1, o.id, "request id") || !num(2, o.gen_seed, "gen seed") || !num(3, o.max_new, "max_new")) return res;
        if (o.max_new > (std::int64_t{1} << 30)) return fail("max_new out of range");
        std::int64_t total = 0;
        for (std::size_t i = 4; i < f.size(); ++i) {
          const std::size_t colon = f[i].find(':');
          segment sg;
          if (colon == std::string_view::npos || !detail::parse_uint(f[i].substr(0, colon), sg.seed) ||
              !detail::parse_uint(f[i].substr(colon + 1), sg.len))
            return fail("bad segment '" + std::string(f[i]) + "' (expected seed:len)");
          if (sg.len < 1) return fail("segment length must be positive");
          total += sg.len;
          if (total > (std::int64_t{1} << 24)) return fail("prompt longer than 2^24 tokens");
          o.segments.push_back(sg);
        }
        if (defined.count(o.id) != 0) return fail("request " + std::to_string(o.id) + " is defined twice");
        defined.insert(o.id);
      } else if (kw == "fork") {
        if (!need(4)) return fail("'fork' takes a parent request id, a child request id and a gen seed");
        o.kind = op_kind::fork;
        if (!num(1, o.id, "parent request id") || !num(2, o.child, "child request id") || !num(3, o.gen_seed, "gen seed"))
          return res;
        if (defined.count(o.id) == 0) return fail("request " + std::to_string(o.id) + " is not defined (no earlier 'req')");
        if (defined.count(o.child) != 0) return fail("request " + std::to_string(o.child) + " is defined twice");
        defined.insert(o.child);
      } else if (kw == "run") {
        if (!need(2)) return fail("'run' takes max_steps");
        o.kind = op_kind::run;
        if (!num(1, o.n, "max_steps")) return res;
        // Like every other count, bounded: a step count near 2^63 would be a `run 0` that escapes its guard.
        if (o.n > (std::int64_t{1} << 30)) return fail("max_steps out of range (at most 2^30; 0 = until done)");
      } else {
        const bool has_n = kw == "decode";
        if (!need(has_n ? 3 : 2)) return fail("'" + std::string(kw) + "' takes a request id" + (has_n ? " and a count" : ""));
        o.kind = kw == "admit" ? op_kind::admit : kw == "decode" ? op_kind::decode : op_kind::finish;
        if (!num(1, o.id, "request id")) return res;
        if (has_n && !num(2, o.n, "token count")) return res;
        if (has_n && o.n > (std::int64_t{1} << 30)) return fail("token count out of range");
        if (defined.count(o.id) == 0) return fail("request " + std::to_string(o.id) + " is not defined (no earlier 'req')");
      }
    } else {
      return fail("unknown record '" + std::string(kw) + "'");
    }
    t.ops.push_back(std::move(o));
  }
  if (!seen_magic) {
    line_no = 1;
    return fail("empty trace (expected 'kvtrace 1')");
  }
  if (!seen_op && !header_complete("")) return res;
  res.value = std::move(t);
  return res;
}

}  // namespace kvreplay
