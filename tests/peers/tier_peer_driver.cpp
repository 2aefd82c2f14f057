// SPDX-License-Identifier: Apache-2.0
// host_tier driven line by line from stdin, one answer per line on stdout, for tests/peers/vllm_offload_peer.py (the
// same calls through vLLM's own offloading manager, answers compared). Not a test of its own.
//
//   tier_peer_driver lru|arc NUM_BLOCKS STORE_THRESHOLD < calls
//
// Calls: "lookup K" (0 miss, 1 hit, 2 pending), "touch K...", "load K..." (the host blocks, or "err"), "done_load
// K...", "store K..." ("keys|blocks|evicted", or "none" when refused), "ok K..." / "fail K..." (complete_store),
// "reset". Keys are unsigned 64-bit integers.
#include <kvpager/tier/arc_tier.hpp>
#include <kvpager/tier/host_tier.hpp>
#include <kvpager/tier/lru_tier.hpp>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace kvpager;

template <class P>
int run(std::int32_t blocks, std::int32_t threshold) {
  auto made = host_tier<P>::create({blocks, threshold});
  if (!made) {
    std::cerr << "tier_peer_driver: " << made.error().message() << "\n";
    return 2;
  }
  host_tier<P> t = std::move(*made);
  tier_store_plan plan;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string op;
    in >> op;
    std::vector<std::uint64_t> k;
    for (std::uint64_t x; in >> x;) k.push_back(x);
    if (op == "lookup" && !k.empty()) {
      std::cout << static_cast<int>(t.lookup(k[0])) << "\n";
    } else if (op == "touch") {
      t.touch(k);
      std::cout << "ok\n";
    } else if (op == "load") {
      std::vector<block_id> b(k.size());
      if (!t.prepare_load(k, b)) {
        std::cout << "err\n";
        continue;
      }
      for (const block_id v : b) std::cout << v << " ";
      std::cout << "\n";
    } else if (op == "done_load") {
      std::cout << (t.complete_load(k) ? "ok" : "err") << "\n";
    } else if (op == "store") {
      if (!t.prepare_store(k, plan)) {
        std::cout << "none\n";
        continue;
      }
      for (const auto v : plan.keys) std::cout << v << " ";
      std::cout << "|";
      for (const auto v : plan.host_blocks) std::cout << v << " ";
      std::cout << "|";
      for (const auto v : plan.evicted) std::cout << v << " ";
      std::cout << "\n";
    } else if (op == "ok" || op == "fail") {
      t.complete_store(k, op == "ok");
      std::cout << "ok\n";
    } else if (op == "reset") {
      t.reset();
      std::cout << "ok\n";
    } else {
      std::cerr << "tier_peer_driver: line '" << line << "': unknown call\n";
      return 2;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: tier_peer_driver lru|arc NUM_BLOCKS STORE_THRESHOLD < calls\n";
    return 2;
  }
  const std::string policy = argv[1];
  char* end = nullptr;
  const long blocks = std::strtol(argv[2], &end, 10);
  const bool blocks_ok = *end == '\0' && blocks > 0 && blocks <= INT32_MAX;
  const long threshold = std::strtol(argv[3], &end, 10);
  if (!blocks_ok || *end != '\0' || threshold < 1 || threshold > INT32_MAX) {
    std::cerr << "tier_peer_driver: NUM_BLOCKS and STORE_THRESHOLD must be positive integers\n";
    return 2;
  }
  if (policy == "arc") return run<arc_tier>(static_cast<std::int32_t>(blocks), static_cast<std::int32_t>(threshold));
  if (policy == "lru") return run<lru_tier>(static_cast<std::int32_t>(blocks), static_cast<std::int32_t>(threshold));
  std::cerr << "tier_peer_driver: unknown policy '" << policy << "'\n";
  return 2;
}
