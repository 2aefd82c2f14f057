// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// The serving layer over the cache layer (kvpager/cache.hpp): the continuous-batching scheduler with its presets
/// and step output (sched/), the tuning policies it takes (tuning/), and the monitor's snapshot (monitor/metrics.hpp).
/// Header-only. The monitor's heavier parts are included on their own by the code that uses them:
///   #include <kvpager/monitor/health.hpp>      // health_check and metrics_recorder (<chrono>)
///   #include <kvpager/monitor/prometheus.hpp>  // write_prometheus (<charconv>, <string>)
///   #include <kvpager/monitor/json.hpp>        // metrics_json_writer (nlohmann-json)

#include "kvpager/cache.hpp"

#include "kvpager/tuning/batch_size_tuner.hpp"
#include "kvpager/tuning/block_size_advisor.hpp"
#include "kvpager/tuning/priority_aging.hpp"
#include "kvpager/tuning/swap_cost_model.hpp"

#include "kvpager/sched/scheduler.hpp"
#include "kvpager/sched/scheduler_config.hpp"
#include "kvpager/sched/step_output.hpp"

#include "kvpager/monitor/metrics.hpp"
