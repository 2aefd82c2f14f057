// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// One error vocabulary at the kernel boundary: the C ABI's KVPAGER_STATUS_* codes, their text (what
/// kvpager_status_string returns) and the one mapping from a code to kvpager::status that every C++ kernel wrapper and
/// executor uses. Header-only: the C function and the C++ side read the same table.

#include <cstdint>

#include "kvpager/c/kernels.h"
#include "kvpager/core/config.hpp"
#include "kvpager/core/status.hpp"

KVPAGER_NAMESPACE_BEGIN

/// Text of a KVPAGER_STATUS_* code, "<name>: <what it means>"; a fixed text for a code the library does not define.
/// Never null; static storage.
[[nodiscard]] constexpr const char* kernel_status_string(std::int32_t code) noexcept {
  switch (code) {
    case KVPAGER_STATUS_OK: return "KVPAGER_STATUS_OK: success";
    case KVPAGER_STATUS_INVALID_ARGUMENT:
      return "KVPAGER_STATUS_INVALID_ARGUMENT: a null pointer, or a size or count out of range";
    case KVPAGER_STATUS_NO_DEVICE: return "KVPAGER_STATUS_NO_DEVICE: CUDA not built in, no driver, or no device";
    case KVPAGER_STATUS_INVALID_BLOCK:
      return "KVPAGER_STATUS_INVALID_BLOCK: a block id outside the pool, or a slot outside the pool";
    case KVPAGER_STATUS_SEQ_TOO_LONG:
      return "KVPAGER_STATUS_SEQ_TOO_LONG: a sequence longer than its page table row (or a negative length)";
    case KVPAGER_STATUS_BAD_HEADS:
      return "KVPAGER_STATUS_BAD_HEADS: num_kv_heads not positive, or num_q_heads not a positive multiple of it";
    case KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM:
      return "KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM: head_dim is not 64, 80, 96, 112, 128 or 256";
    case KVPAGER_STATUS_UNSUPPORTED_DTYPE:
      return "KVPAGER_STATUS_UNSUPPORTED_DTYPE: dtype is not fp32, fp16 or bf16 (fp8 KV: only the _fp8 functions)";
    case KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE:
      return "KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE: block_size is not 8, 16 or 32";
    case KVPAGER_STATUS_OUT_OF_MEMORY:
      return "KVPAGER_STATUS_OUT_OF_MEMORY: a host workspace could not be allocated (nothing written)";
    case KVPAGER_STATUS_DEVICE_ERROR:
      return "KVPAGER_STATUS_DEVICE_ERROR: the CUDA runtime or a kernel launch failed (a device fault, not bad input)";
    default: return "unknown kvpager status code";
  }
}

/// The errc a KVPAGER_STATUS_* code means on the C++ side. Total: OK is errc::ok; a malformed call
/// (INVALID_ARGUMENT, SEQ_TOO_LONG, BAD_HEADS) is errc::invalid_argument; INVALID_BLOCK errc::invalid_block; what this
/// build or machine cannot run (NO_DEVICE, the UNSUPPORTED_* geometry codes) errc::unsupported; OUT_OF_MEMORY
/// errc::out_of_memory; DEVICE_ERROR errc::device_error (transient or fatal device trouble, never "unsupported");
/// any other code errc::invalid_argument (a code from a library newer than these headers).
[[nodiscard]] constexpr errc kernel_errc(std::int32_t code) noexcept {
  switch (code) {
    case KVPAGER_STATUS_OK: return errc::ok;
    case KVPAGER_STATUS_INVALID_BLOCK: return errc::invalid_block;
    case KVPAGER_STATUS_NO_DEVICE:
    case KVPAGER_STATUS_UNSUPPORTED_HEAD_DIM:
    case KVPAGER_STATUS_UNSUPPORTED_DTYPE:
    case KVPAGER_STATUS_UNSUPPORTED_BLOCK_SIZE: return errc::unsupported;
    case KVPAGER_STATUS_OUT_OF_MEMORY: return errc::out_of_memory;
    case KVPAGER_STATUS_DEVICE_ERROR: return errc::device_error;
    default: return errc::invalid_argument;  // INVALID_ARGUMENT, SEQ_TOO_LONG, BAD_HEADS, unknown codes
  }
}

/// The status a KVPAGER_STATUS_* code maps to: kernel_errc(code), the message kernel_status_string(code) and the code
/// itself as detail(); ok_status() for KVPAGER_STATUS_OK. The one place a C code becomes a kvpager::status.
[[nodiscard]] constexpr status kernel_status(std::int32_t code) noexcept {
  if (code == KVPAGER_STATUS_OK) return ok_status();
  return status{kernel_errc(code), kernel_status_string(code), code};
}

KVPAGER_NAMESPACE_END
