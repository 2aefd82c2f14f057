// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The kernel API (kernels/, beside the layers, speaking only core): the C ABI (c/kernels.h), the C++ decode and
/// prefill (paged_kv_view, page_table_view, decode_params, prefill_params), the block moves (append_params,
/// copy_params, swap_params), can_implement, the one status mapping,
/// kv_layout, the step executors (step_executor, host_kv_pools, cuda_executor) and the fp16/bf16/fp8 conversions.
/// Needs the compiled library: link kvpager::kernels. docs/kernels.md.

#include "kvpager/c/kernels.h"

#include "kvpager/kernels/attention.hpp"
#include "kvpager/kernels/block_moves.hpp"
#include "kvpager/kernels/can_implement.hpp"
#include "kvpager/kernels/cuda_attention.hpp"
#include "kvpager/kernels/cuda_executor.hpp"
#include "kvpager/kernels/float16.hpp"
#include "kvpager/kernels/float8.hpp"
#include "kvpager/kernels/kernel_status.hpp"
#include "kvpager/kernels/kv_layout.hpp"
#include "kvpager/kernels/prefill.hpp"
#include "kvpager/kernels/step_executor.hpp"
