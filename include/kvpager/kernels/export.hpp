// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// KVPAGER_KERNELS_EXPORT marks the C++ symbols of libkvpager_kernels (built with hidden visibility); the C ABI's own
/// functions carry KVPAGER_C_API (kvpager/c/kernels.h).

#if defined(_WIN32)
#define KVPAGER_KERNELS_EXPORT __declspec(dllexport)
#else
#define KVPAGER_KERNELS_EXPORT __attribute__((visibility("default")))
#endif
