// Issue 9, item 15: a decode called from a static object's destructor used the CPU kernels' worker pool (and the
// calling thread's thread_local buffers) after they were freed at exit (ASan: heap-use-after-free in
// worker_pool.hpp). This program's static `caller` is constructed before the first decode call, so it is destroyed
// after the pool was shut down and after the main thread's thread_locals: its destructor decodes (all cores, with and
// without splits) and checks the output against a single-threaded run. Exit status 0 only if every call returned OK
// with the same output; the sanitizer build turns any use after free into a failure.
#include <kvpager/c/kernels.h>
#include <kvpager/kernels/attention.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

/// Decodes 4 sequences of 1000 tokens (8 query heads, 2 KV heads; enough work for every core) with `threads` and
/// `splits`; returns the output, empty if the call failed.
std::vector<float> decode(std::int32_t threads, std::int32_t splits) {
  constexpr std::int32_t seqs = 4, hq = 8, hkv = 2, d = 64, bs = 16, len = 1000, maxb = (len + bs - 1) / bs;
  constexpr std::int32_t nb = seqs * maxb;
  std::vector<float> kv(static_cast<std::size_t>(nb) * 2 * hkv * bs * d), q(static_cast<std::size_t>(seqs) * hq * d);
  std::vector<float> out(q.size(), -1.0F);
  for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>((i * 2654435761U) % 1000) / 1000.0F - 0.5F;
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 40503U) % 100) / 100.0F - 0.5F;
  std::vector<std::int32_t> table(static_cast<std::size_t>(nb)), lens(seqs, len);
  for (std::int32_t b = 0; b < nb; ++b) table[static_cast<std::size_t>(b)] = (b * 7) % nb;
  kvpager::decode_params p;
  p.out = out.data();
  p.query = q.data();
  p.kv = kvpager::paged_kv_view::hnd(kv.data(), KVPAGER_DTYPE_FP32, nb, hkv, bs, d);
  p.pages.block_table = table.data();
  p.pages.row_stride = maxb;
  p.pages.seq_lens = lens.data();
  p.num_seqs = seqs;
  p.num_q_heads = hq;
  p.scale = 0.125F;
  p.num_splits = splits;
  p.num_threads = threads;
  if (kvpager::paged_attention_decode_cpu(p) != KVPAGER_STATUS_OK) return {};
  return out;
}

/// Every thread count and split gives the single-threaded answer (bit for bit: each work item is computed alone).
bool decode_agrees(const char* when) {
  const std::vector<float> one = decode(1, 1);
  bool ok = !one.empty();
  for (const std::int32_t splits : {1, 3}) {
    const std::vector<float> all = decode(0, splits);
    if (splits == 1 ? all != one : all.size() != one.size()) ok = false;
    for (std::size_t i = 0; ok && i < one.size(); ++i)
      if (all[i] - one[i] > 1e-5F || one[i] - all[i] > 1e-5F) ok = false;
  }
  if (!ok) std::fprintf(stderr, "decode %s: wrong status or output\n", when);
  return ok;
}

struct decodes_in_destructor {
  decodes_in_destructor() = default;
  decodes_in_destructor(const decodes_in_destructor&) = delete;
  decodes_in_destructor& operator=(const decodes_in_destructor&) = delete;
  ~decodes_in_destructor() {
    if (!decode_agrees("from a static destructor")) std::_Exit(1);
    std::puts("decode from a static destructor: OK");
  }
};
const decodes_in_destructor caller;  // constructed before main, so destroyed after the kernels' pool

}  // namespace

int main() { return decode_agrees("in main") ? 0 : 1; }
