// SPDX-License-Identifier: Apache-2.0
// The CPU decode's prefetch of the chunks ahead (kernels/cpu/prefetch_runs.inc): over random byte runs (any length,
// any alignment) and any number of ticks, every cache line of every run is issued exactly once between the ticks and
// flush(), no tick issues more than per_tick lines, and the lines go out in address order within each run, runs in
// their order. A run that ends exactly where a tick's lines end once made the next tick issue a line past the run.
// The same holds when the ticks go through cursors (the kernel's hot loops), one after another or between ticks of
// the object itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

namespace {

#include "kernels/cpu/prefetch_runs.inc"

std::vector<const unsigned char*>* issued = nullptr;  // what the recording Issue appends to

struct record {
  static void line(const unsigned char* p, bool /*nta*/) { issued->push_back(p); }
};

std::uintptr_t line_of(const unsigned char* p) { return reinterpret_cast<std::uintptr_t>(p) / 64; }

/// The kernel's count of lines: ceil(bytes / 64) per run.
std::int64_t lines_of(const byte_run* runs, std::int32_t n) {
  std::int64_t lines = 0;
  for (std::int32_t r = 0; r < n; ++r) lines += (runs[r].bytes + 63) / 64;
  return lines;
}

/// Iteration `it`'s case: up to 6 byte runs of 1 to 800 bytes at any offset (multiples of 64 among them), apart so
/// that no line is shared, their line count and a number of ticks.
struct random_case {
  std::vector<byte_run> runs;
  std::int32_t n = 0;
  std::int64_t lines = 0, ticks = 0;
  random_case(std::mt19937& rng, int it) {
    static unsigned char buf[1 << 21];
    n = static_cast<std::int32_t>(rng() % 7);
    for (std::int32_t r = 0; r < n; ++r) {
      const std::int64_t bytes = it % 3 == 0 ? 64 * (1 + rng() % 8) : 1 + rng() % 800;
      const std::int64_t off = (it % 5 == 0 ? 64 * (rng() % 60) : rng() % 4000) + r * 250000;
      runs.push_back({buf + off, bytes});
    }
    lines = lines_of(runs.data(), n);
    ticks = 1 + rng() % 40;
  }
};

TEST(CpuDecodePrefetch, EveryLineOfEveryRunOnceInOrderAndNoTickOverBudgetThroughTheObjectOrCursors) {
  std::mt19937 rng(3);
  for (int it = 0; it < 20000; ++it) {
    const random_case c(rng, it);
    const std::vector<byte_run>& runs = c.runs;
    const std::int64_t lines = c.lines, ticks = c.ticks;
    std::vector<const unsigned char*> got;
    issued = &got;
    basic_prefetch_runs<record> pf(runs.data(), c.n, lines, ticks, it % 2 == 0);
    const std::int64_t called = rng() % (ticks + 5);
    // Ticks of the object (it % 4 == 0), or through cursors of random spans (a kernel loop each) with some of the
    // object's own ticks between them.
    for (std::int64_t i = 0; i < called;) {
      if (it % 4 == 0 || rng() % 3 == 0) {
        const std::size_t before = got.size();
        pf.tick();
        ASSERT_LE(static_cast<std::int64_t>(got.size() - before), pf.per_tick) << "iteration " << it;
        ++i;
        continue;
      }
      basic_prefetch_runs<record>::cursor pc(pf);
      for (std::int64_t span = 1 + rng() % 6; span > 0 && i < called; --span, ++i) {
        const std::size_t before = got.size();
        pc.tick();
        ASSERT_LE(static_cast<std::int64_t>(got.size() - before), pf.per_tick) << "iteration " << it;
      }
    }
    pf.flush();
    ASSERT_EQ(static_cast<std::int64_t>(got.size()), lines) << "iteration " << it;
    // The k-th prefetch of run r is at its start + 64 k: each line a prefetch touches is within the run, and the
    // addresses rise within a run, runs in their order.
    std::size_t k = 0;
    for (const byte_run& r : runs)
      for (std::int64_t o = 0; o < r.bytes; o += 64, ++k) ASSERT_EQ(got[k], r.p + o) << "iteration " << it << " line " << k;
    std::set<std::uintptr_t> distinct;
    for (const unsigned char* p : got) distinct.insert(line_of(p));
    EXPECT_EQ(distinct.size(), got.size()) << "a line issued twice, iteration " << it;
  }
  issued = nullptr;
}

// rest() after any number of ticks: walking its runs issues exactly the lines the ticks have not, in the same order
// (the decode hands a work item's first chunk's rest to the next prefetch this way).
TEST(CpuDecodePrefetch, RestHoldsExactlyTheLinesNotYetIssued) {
  std::mt19937 rng(5);
  for (int it = 0; it < 20000; ++it) {
    const random_case c(rng, it);
    const std::vector<byte_run>& runs = c.runs;
    const std::int32_t n = c.n;
    const std::int64_t lines = c.lines, ticks = c.ticks;
    std::vector<const unsigned char*> got;
    issued = &got;
    basic_prefetch_runs<record> pf(runs.data(), n, lines, ticks, false);
    for (std::int64_t i = 0, called = rng() % (ticks + 5); i < called; ++i) {
      if (rng() % 2 == 0) {
        pf.tick();
      } else {
        basic_prefetch_runs<record>::cursor pc(pf);
        pc.tick();
      }
    }
    const std::size_t ticked = got.size();
    std::vector<byte_run> left(static_cast<std::size_t>(n) + 1);
    const std::int32_t k = pf.rest(left.data());
    ASSERT_LE(k, n) << "iteration " << it;
    basic_prefetch_runs<record> after(left.data(), k, lines_of(left.data(), k), 1 + rng() % 10, false);
    after.flush();
    ASSERT_EQ(static_cast<std::int64_t>(got.size()), lines) << "iteration " << it << ", " << ticked << " ticked";
    std::size_t j = 0;
    for (const byte_run& r : runs)
      for (std::int64_t o = 0; o < r.bytes; o += 64, ++j) ASSERT_EQ(got[j], r.p + o) << "iteration " << it << " line " << j;
    // rest() changed nothing in the object: flushing it now issues its remaining lines a second time
    pf.flush();
    EXPECT_EQ(static_cast<std::int64_t>(got.size()), 2 * lines - static_cast<std::int64_t>(ticked)) << "iteration " << it;
  }
  issued = nullptr;
}

}  // namespace
