// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// xxh3_hasher: the default block hasher of prefix_caching. XXH3-64 (xxHash, Debian package libxxhash-dev), used
/// header-only (XXH_INLINE_ALL), so linking nothing and clashing with no other copy of xxHash in the process.
/// A block hasher is any callable `std::uint64_t(std::uint64_t seed, std::span<const token_id> tokens) noexcept`;
/// the seed carries the parent block's hash, which chains the hashes.

#include <cstdint>
#include <span>

#include "kvpager/core/config.hpp"

#if !KVPAGER_HAS_XXHASH
#error "kvpager: prefix_caching's default hasher needs xxHash, and this build has KVPAGER_HAS_XXHASH=0 (CMake: -DKVPAGER_WITH_XXHASH=ON)"
#elif !__has_include(<xxhash.h>)
#error "kvpager: <xxhash.h> not found: prefix_caching's default hasher needs xxHash (Debian/Ubuntu: apt-get install libxxhash-dev; Fedora: xxhash-devel; Homebrew: xxhash), or build kvpager with -DKVPAGER_WITH_XXHASH=OFF"
#endif
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "kvpager/core/types.hpp"

KVPAGER_NAMESPACE_BEGIN

struct xxh3_hasher {
  [[nodiscard]] std::uint64_t operator()(std::uint64_t seed, std::span<const token_id> tokens) const noexcept {
    return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), seed);
  }
};

KVPAGER_NAMESPACE_END
