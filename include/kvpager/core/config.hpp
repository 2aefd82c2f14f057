// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// Library-wide configuration macros: version, versioned inline namespace, exception and assertion switches.

#define KVPAGER_VERSION_MAJOR 0
#define KVPAGER_VERSION_MINOR 3
#define KVPAGER_VERSION_PATCH 0
/// Single integer version: major * 10000 + minor * 100 + patch.
#define KVPAGER_VERSION (KVPAGER_VERSION_MAJOR * 10000 + KVPAGER_VERSION_MINOR * 100 + KVPAGER_VERSION_PATCH)

/// Everything lives in `kvpager::v0_3`, inlined into `kvpager`, so two kvpager versions linked into one process
/// do not collide (the CUB convention).
#define KVPAGER_NAMESPACE_BEGIN \
  namespace kvpager {           \
  inline namespace v0_3 {
#define KVPAGER_NAMESPACE_END \
  }                           \
  }

/// Marks the small value functions kernels call on the device too (paged_kv_view::offset): __host__ __device__
/// under nvcc, nothing elsewhere.
#if defined(__CUDACC__)
#define KVPAGER_HOST_DEVICE __host__ __device__
#else
#define KVPAGER_HOST_DEVICE
#endif

/// xxHash (prefix_caching's default block hasher, sharing/xxh3_hasher.hpp) is a build feature, the same on every
/// machine: CMake's KVPAGER_WITH_XXHASH (on by default) defines KVPAGER_HAS_XXHASH for every consumer of
/// kvpager::kvpager; without CMake it is on. On, the umbrella headers include prefix caching and the compositions
/// over it, and a machine without <xxhash.h> gets an #error naming the package; off (-DKVPAGER_HAS_XXHASH=0), they
/// leave them out.
#ifndef KVPAGER_HAS_XXHASH
#define KVPAGER_HAS_XXHASH 1
#endif

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#define KVPAGER_HAS_EXCEPTIONS 1
#else
#define KVPAGER_HAS_EXCEPTIONS 0
#endif

/// Internal invariant checks (KVPAGER_ASSERT) are on unless NDEBUG is defined; force with KVPAGER_ENABLE_ASSERTS=0/1.
#ifndef KVPAGER_ENABLE_ASSERTS
#ifdef NDEBUG
#define KVPAGER_ENABLE_ASSERTS 0
#else
#define KVPAGER_ENABLE_ASSERTS 1
#endif
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KVPAGER_LIKELY(x) __builtin_expect(!!(x), 1)
#define KVPAGER_UNLIKELY(x) __builtin_expect(!!(x), 0)
/// Keeps a rarely taken path out of its caller, so that the caller's hot path stays small enough for the
/// compiler to inline what that path calls (a scheduler step's decode loop).
#define KVPAGER_NOINLINE __attribute__((noinline))
/// Inlines every call of a hot function that is not KVPAGER_NOINLINE (a scheduler step's per-request work).
#define KVPAGER_FLATTEN __attribute__((flatten))
#else
#define KVPAGER_LIKELY(x) (x)
#define KVPAGER_UNLIKELY(x) (x)
#define KVPAGER_NOINLINE
#define KVPAGER_FLATTEN
#endif

/// The compiled instances of the named compositions (CMake target kvpager::compositions, cache/compositions.hpp):
/// defined to 1 for every translation unit of a program that links them (the target defines it), 0 otherwise.
/// On, paged_kv_cache's, hybrid_kv_cache's and scheduler's larger members are ordinary (not inline) member
/// templates, and the named compositions are `extern template`s: a translation unit that uses them instantiates
/// none of those members (they come from the library), which is most of what such a translation unit cost to
/// compile. Off (header-only), the same members are inline, exactly as when they were defined in their classes.
/// It must be the same in every translation unit of a program (it changes whether the members are inline).
#ifndef KVPAGER_EXTERN_COMPOSITIONS
#define KVPAGER_EXTERN_COMPOSITIONS 0
#endif
#if KVPAGER_EXTERN_COMPOSITIONS
#define KVPAGER_OUT_OF_LINE
#else
#define KVPAGER_OUT_OF_LINE inline
#endif
