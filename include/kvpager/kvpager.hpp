// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// kvpager: paged KV-cache memory management for LLM inference engines. This header is every umbrella: the cache
/// layer (kvpager/cache.hpp: core, concepts, policies, paged_kv_cache, the named compositions), the serving layer
/// (kvpager/serving.hpp: scheduler, tuning, the monitor's snapshot), the kernel API (kvpager/kernels.hpp: its calls
/// need kvpager::kernels at link time), the sizing arithmetic (sizing/kv_sizing, model_shape, tensor_parallel) and KV
/// transfer between caches (transfer/: the runs a transfer moves, the transport concept, the in-process transport;
/// the UCX transport, transfer/ucx_transport.hpp, needs libucx and is included by the code that uses it).
/// Include the narrower umbrella a translation unit needs: kvpager/cache.hpp costs about half of this one to
/// compile (bench/RESULTS.md, "Compile cost").

#include "kvpager/cache.hpp"
#include "kvpager/kernels.hpp"
#include "kvpager/serving.hpp"

#include "kvpager/sizing/kv_sizing.hpp"
#include "kvpager/sizing/model_shape.hpp"
#include "kvpager/sizing/tensor_parallel.hpp"
#include "kvpager/transfer/inproc_transport.hpp"
#include "kvpager/transfer/kv_runs.hpp"
#include "kvpager/transfer/transport.hpp"
