// SPDX-License-Identifier: Apache-2.0
#pragma once
// A safetensors reader (https://huggingface.co/docs/safetensors): the file is memory-mapped, then its layout is
// checked in full before any tensor is handed out: the 8-byte little-endian header length (inside the file and at
// most 100 MB, the format's own limit), the header (a JSON object: nlohmann-json, parsed without exceptions), and for
// every tensor its dtype (F32, F16 or BF16), its shape (non-negative dimensions whose product fits in 64 bits), its
// byte range (begin <= end, inside the data section, exactly shape x element size bytes) and no two ranges
// overlapping. A failed open says which file and which tensor or field, and leaves the reader empty.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvgen {

/// Element types the reader accepts.
enum class st_dtype : std::uint8_t { f32, f16, bf16 };

[[nodiscard]] inline const char* to_string(st_dtype d) noexcept {
  switch (d) {
    case st_dtype::f32: return "F32";
    case st_dtype::f16: return "F16";
    case st_dtype::bf16: return "BF16";
  }
  return "?";
}
[[nodiscard]] inline std::size_t elem_size(st_dtype d) noexcept { return d == st_dtype::f32 ? 4 : 2; }

/// One tensor of a mapped file: its bytes stay valid while the file that holds them is alive.
struct st_tensor {
  std::string name;
  st_dtype dtype = st_dtype::f32;
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;
  std::int64_t bytes = 0;
  [[nodiscard]] std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (const std::int64_t d : shape) n *= d;
    return n;
  }
};

/// A memory-mapped safetensors file. Move-only; unmaps on destruction.
class safetensors_file {
 public:
  safetensors_file() = default;
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;
  safetensors_file(safetensors_file&& o) noexcept { *this = std::move(o); }
  safetensors_file& operator=(safetensors_file&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      tensors_ = std::move(o.tensors_);
      base_ = std::exchange(o.base_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~safetensors_file() { unmap(); }

  /// The largest header the format allows (safetensors' MAX_HEADER_SIZE).
  static constexpr std::uint64_t max_header_bytes = 100'000'000;

  /// Maps `path` and checks it. Returns "" or the error ("FILE: ..."); on error the object is left empty.
  std::string open(const std::string& path) {
    unmap();
    tensors_.clear();
    path_ = path;
    std::string err = map(path);
    if (err.empty()) err = parse();
    if (!err.empty()) {
      unmap();
      tensors_.clear();
      return path + ": " + err;
    }
    return "";
  }

  /// Checks a file's bytes already in memory (the fuzzer's entry point; `bytes` must outlive the object).
  std::string open_bytes(std::span<const std::byte> bytes, const std::string& name) {
    unmap();
    tensors_.clear();
    path_ = name;
    base_ = nullptr;
    size_ = bytes.size();
    borrowed_ = bytes.data();
    std::string err = parse();
    if (!err.empty()) {
      tensors_.clear();
      borrowed_ = nullptr;
      size_ = 0;
      return name + ": " + err;
    }
    return "";
  }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] const std::vector<st_tensor>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] std::size_t mapped_bytes() const noexcept { return size_; }
  [[nodiscard]] const st_tensor* find(std::string_view name) const noexcept {
    for (const st_tensor& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }

 private:
  [[nodiscard]] const std::byte* bytes() const noexcept {
    return base_ != nullptr ? static_cast<const std::byte*>(base_) : borrowed_;
  }

  std::string map(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::string("cannot open: ") + std::strerror(errno);
    struct stat sb {};
    if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
      ::close(fd);
      return "not a regular file";
    }
    size_ = static_cast<std::size_t>(sb.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        size_ = 0;
        return std::string("cannot map: ") + std::strerror(errno);
      }
      base_ = p;
    }
    ::close(fd);
    return "";
  }

  void unmap() noexcept {
    if (base_ != nullptr) ::munmap(base_, size_);
    base_ = nullptr;
    borrowed_ = nullptr;
    size_ = 0;
  }

  std::string parse() {
    if (size_ < 8) return "truncated: " + std::to_string(size_) + " bytes, shorter than the 8-byte header length";
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(bytes()[i]);
    if (n > size_ - 8)
      return "header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size_) +
             " bytes)";
    if (n > max_header_bytes) return "header length " + std::to_string(n) + " is over the format's 100 MB limit";
    const auto* h = reinterpret_cast<const char*>(bytes() + 8);
    const nlohmann::json doc = nlohmann::json::parse(h, h + n, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return "the header is not valid JSON";
    if (!doc.is_object()) return "the header is not a JSON object";
    const std::uint64_t data_size = size_ - 8 - n;
    const std::byte* data = bytes() + 8 + n;
    struct range {
      std::uint64_t begin, end;
      std::size_t index;
    };
    std::vector<range> ranges;
    for (const auto& [name, v] : doc.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) return "__metadata__ is not an object";
        continue;
      }
      const std::string where = "tensor '" + name + "': ";
      if (!v.is_object()) return where + "not an object";
      const auto dt = v.find("dtype");
      if (dt == v.end() || !dt->is_string()) return where + "no dtype string";
      st_tensor t;
      t.name = name;
      const std::string& d = dt->get_ref<const std::string&>();
      if (d == "F32") {
        t.dtype = st_dtype::f32;
      } else if (d == "F16") {
        t.dtype = st_dtype::f16;
      } else if (d == "BF16") {
        t.dtype = st_dtype::bf16;
      } else {
        return where + "dtype " + d + " is not supported (F32, F16, BF16)";
      }
      const auto sh = v.find("shape");
      if (sh == v.end() || !sh->is_array()) return where + "no shape array";
      std::uint64_t numel = 1;
      for (const auto& x : *sh) {
        if (!x.is_number_unsigned()) return where + "a shape dimension is not a non-negative integer";
        const auto dim = x.get<std::uint64_t>();
        if (dim > static_cast<std::uint64_t>(INT64_MAX) || (dim != 0 && numel > static_cast<std::uint64_t>(INT64_MAX) / 4 / dim))
          return where + "shape too large";
        numel *= dim;
        t.shape.push_back(static_cast<std::int64_t>(dim));
      }
      const auto off = v.find("data_offsets");
      if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
          !(*off)[1].is_number_unsigned())
        return where + "data_offsets is not a pair of non-negative integers";
      const auto b = (*off)[0].get<std::uint64_t>(), e = (*off)[1].get<std::uint64_t>();
      if (b > e) return where + "data_offsets begin " + std::to_string(b) + " is past its end " + std::to_string(e);
      if (e > data_size)
        return where + "data_offsets end " + std::to_string(e) + " is outside the file's data (" +
               std::to_string(data_size) + " bytes)";
      const std::uint64_t want = numel * elem_size(t.dtype);
      if (e - b != want)
        return where + std::to_string(e - b) + " bytes for a " + to_string(t.dtype) + " tensor of " +
               std::to_string(numel) + " elements (" + std::to_string(want) + " bytes)";
      t.data = data + b;
      t.bytes = static_cast<std::int64_t>(want);
      ranges.push_back({b, e, tensors_.size()});
      tensors_.push_back(std::move(t));
    }
    std::sort(ranges.begin(), ranges.end(), [](const range& a, const range& b) { return a.begin < b.begin; });
    for (std::size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].begin < ranges[i - 1].end && ranges[i].begin != ranges[i].end &&
          ranges[i - 1].begin != ranges[i - 1].end)
        return "tensor '" + tensors_[ranges[i].index].name + "' overlaps tensor '" +
               tensors_[ranges[i - 1].index].name + "'";
    return "";
  }

  std::string path_;
  std::vector<st_tensor> tensors_;
  void* base_ = nullptr;
  const std::byte* borrowed_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kvgen
