# SPDX-License-Identifier: Apache-2.0
"""Parses kvpager's Prometheus text with the Prometheus client's own parser and checks every value against the
JSON of the same snapshot.

    check_prometheus.py <monitor_expose_metrics> <work dir>

Runs the program (a real cache + scheduler run, tests/monitor/scenario.hpp), which writes metrics.prom and
metrics.json into the work dir. Every sample of the text must be one this script knows (below, with the JSON field
it must equal), every known sample must be present, every family must have its HELP and TYPE, and counters must
end in _total. Exits 77 (ctest: skipped) only when prometheus_client cannot be imported (Debian:
python3-prometheus-client, for /usr/bin/python3; .ci/run installs it).
"""
import json
import math
import os
import subprocess
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIP: prometheus_client is not importable by {sys.executable} ({e}); "
          "install python3-prometheus-client", flush=True)
    sys.exit(77)

# (sample name, labels) -> (JSON path, Prometheus type). vLLM's names where vLLM has the metric.
EXPECTED = {
    ("kvpager:kv_cache_usage_perc", ()): ("kv_cache.usage", "gauge"),
    ("kvpager:num_requests_running", ()): ("requests.running", "gauge"),
    ("kvpager:num_requests_waiting", ()): ("requests.waiting", "gauge"),
    ("kvpager:num_requests_swapped", ()): ("requests.swapped", "gauge"),
    ("kvpager:kv_cache_block_size", ()): ("kv_cache.block_size", "gauge"),
    ("kvpager:kv_cache_block_bytes", ()): ("kv_cache.block_bytes", "gauge"),
    ("kvpager:kv_cache_usable_blocks", ()): ("kv_cache.usable_blocks", "gauge"),
    ("kvpager:kv_cache_used_blocks", ()): ("kv_cache.used_blocks", "gauge"),
    ("kvpager:kv_cache_free_blocks", ()): ("kv_cache.free_blocks", "gauge"),
    ("kvpager:kv_cache_evictable_blocks", ()): ("kv_cache.evictable_blocks", "gauge"),
    ("kvpager:kv_cache_cached_blocks", ()): ("kv_cache.cached_blocks", "gauge"),
    ("kvpager:kv_cache_shared_blocks", ()): ("sharing.shared_blocks", "gauge"),
    ("kvpager:kv_cache_logical_blocks", ()): ("sharing.logical_blocks", "gauge"),
    ("kvpager:kv_cache_referenced_blocks", ()): ("sharing.referenced_blocks", "gauge"),
    ("kvpager:kv_cache_shared_fraction", ()): ("sharing.shared_fraction", "gauge"),
    ("kvpager:kv_cache_sharing_ratio", ()): ("sharing.sharing_ratio", "gauge"),
    ("kvpager:internal_waste_tokens", ()): ("internal_waste.tokens", "gauge"),
    ("kvpager:internal_waste_bytes", ()): ("internal_waste.bytes", "gauge"),
    ("kvpager:num_preemptions_total", ()): ("preemptions.total", "counter"),
    ("kvpager:preemptions_total", (("mode", "recompute"),)): ("preemptions.recompute", "counter"),
    ("kvpager:preemptions_total", (("mode", "swap"),)): ("preemptions.swap", "counter"),
    ("kvpager:swap_fallback_recompute_total", ()): ("preemptions.swap_fallback_recompute", "counter"),
    ("kvpager:swaps_total", (("direction", "out"),)): ("swaps.outs", "counter"),
    ("kvpager:swaps_total", (("direction", "in"),)): ("swaps.ins", "counter"),
    ("kvpager:swapped_blocks_total", (("direction", "out"),)): ("swaps.out_blocks", "counter"),
    ("kvpager:swapped_blocks_total", (("direction", "in"),)): ("swaps.in_blocks", "counter"),
    ("kvpager:swapped_bytes_total", (("direction", "out"),)): ("swaps.out_bytes", "counter"),
    ("kvpager:swapped_bytes_total", (("direction", "in"),)): ("swaps.in_bytes", "counter"),
    ("kvpager:prefix_cache_queries_total", ()): ("prefix_cache.queries", "counter"),
    ("kvpager:prefix_cache_hits_total", ()): ("prefix_cache.hits", "counter"),
    ("kvpager:resumed_prefix_cache_queries_total", ()): ("prefix_cache.resumed_queries", "counter"),
    ("kvpager:resumed_prefix_cache_hits_total", ()): ("prefix_cache.resumed_hits", "counter"),
    ("kvpager:evictions_total", ()): ("prefix_cache.evictions", "counter"),
    ("kvpager:admission_answers_total", (("answer", "ok"),)): ("admission.ok", "counter"),
    ("kvpager:admission_answers_total", (("answer", "later"),)): ("admission.later", "counter"),
    ("kvpager:admission_answers_total", (("answer", "never"),)): ("admission.never", "counter"),
    ("kvpager:scheduler_steps_total", ()): ("steps", "counter"),
    ("kvpager:num_requests_loading", ()): ("requests.loading", "gauge"),
    ("kvpager:prefix_cache_host_hits_total", ()): ("prefix_cache.host_hits", "counter"),
    ("kvpager:host_tier_transfers_in_flight", ()): ("host_tier.in_flight", "gauge"),
    ("kvpager:host_tier_transfer_failures_total", (("direction", "load"),)): ("host_tier.failed_loads", "counter"),
    ("kvpager:host_tier_transfer_failures_total", (("direction", "store"),)): ("host_tier.failed_stores", "counter"),
    ("kvpager:host_tier_load_timeouts_total", ()): ("host_tier.load_timeouts", "counter"),
}


def lookup(doc, path):
    for key in path.split("."):
        doc = doc[key]
    return doc


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    program, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    run = subprocess.run([program, work], capture_output=True, text=True)
    if run.returncode != 0:
        print(f"FAIL: {program} exited {run.returncode}\n{run.stderr}")
        return 1
    with open(os.path.join(work, "metrics.prom"), encoding="utf-8") as f:
        text = f.read()
    with open(os.path.join(work, "metrics.json"), encoding="utf-8") as f:
        doc = json.load(f)

    errors = []
    # Text-level rules of format 0.0.4 that the parser tolerates: HELP and TYPE for every family, before samples.
    helped, typed = set(), {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split(" ", 3)[2])
        elif line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            typed[name] = typ
        elif line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name not in helped or name not in typed:
                errors.append(f"sample {name} has no HELP or TYPE line before it")
    if not text.endswith("\n"):
        errors.append("the text does not end with a newline")

    seen = set()
    checked = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key not in EXPECTED:
                errors.append(f"unexpected sample {key}")
                continue
            if key in seen:
                errors.append(f"sample {key} appears twice")
            seen.add(key)
            path, typ = EXPECTED[key]
            if family.type != typ:
                errors.append(f"{sample.name}: type {family.type}, expected {typ}")
            if typ == "counter" and not sample.name.endswith("_total"):
                errors.append(f"counter {sample.name} does not end in _total")
            if not family.documentation:
                errors.append(f"{sample.name}: empty HELP")
            expected = lookup(doc, path)
            if not (sample.value == float(expected) or (math.isnan(sample.value) and math.isnan(float(expected)))):
                errors.append(f"{sample.name}{dict(sample.labels)} = {sample.value!r}, JSON {path} = {expected!r}")
            checked += 1
    for key in EXPECTED:
        if key not in seen:
            errors.append(f"missing sample {key}")

    # The per-group families of a cache with KV cache groups (groups.prom against groups.json).
    with open(os.path.join(work, "groups.prom"), encoding="utf-8") as f:
        gtext = f.read()
    with open(os.path.join(work, "groups.json"), encoding="utf-8") as f:
        gdoc = json.load(f)
    gexpected = {"kvpager:kv_cache_group_usage_perc": ("usage", "gauge"),
                 "kvpager:kv_cache_group_blocks": ("blocks", "gauge"),
                 "kvpager:kv_cache_group_peak_blocks": ("peak_blocks", "gauge"),
                 "kvpager:kv_cache_group_table_entries": ("table_entries", "gauge"),
                 "kvpager:kv_cache_group_released_blocks_total": ("released_blocks", "counter"),
                 "kvpager:kv_cache_group_prefix_hit_blocks_total": ("hit_blocks", "counter")}
    gseen = set()
    for family in text_string_to_metric_families(gtext):
        for sample in family.samples:
            if sample.name not in gexpected:
                errors.append(f"unexpected group sample {sample.name}")
                continue
            field, typ = gexpected[sample.name]
            if family.type != typ or not family.documentation:
                errors.append(f"{sample.name}: type {family.type} (expected {typ}) or empty HELP")
            g = int(sample.labels["group"])
            want = gdoc[g]
            if sample.labels["kind"] != want["kind"] or sample.value != float(want[field]):
                errors.append(f"{sample.name}{dict(sample.labels)} = {sample.value!r}, JSON {want}")
            gseen.add((sample.name, g))
            checked += 1
    if len(gseen) != len(gexpected) * len(gdoc):
        errors.append(f"group samples: {len(gseen)} of {len(gexpected) * len(gdoc)}")

    # A host tier's families (tier.prom against the tier's raw figures in tier.json).
    with open(os.path.join(work, "tier.prom"), encoding="utf-8") as f:
        ttext = f.read()
    with open(os.path.join(work, "tier.json"), encoding="utf-8") as f:
        t = json.load(f)
    bs, bb = t["block_size"], t["bytes_per_block"]
    texpected = {
        ("kvpager:external_prefix_cache_queries_total", ()): ("counter", t["lookups"] * bs),
        ("kvpager:external_prefix_cache_hits_total", ()): ("counter", t["hits"] * bs),
        ("kvpager:kv_offload_total_bytes_total", (("transfer_type", "gpu_to_cpu"),)): ("counter", t["stored"] * bb),
        ("kvpager:kv_offload_total_bytes_total", (("transfer_type", "cpu_to_gpu"),)): ("counter", t["loads"] * bb),
        ("kvpager:host_tier_capacity_blocks", ()): ("gauge", t["num_blocks"]),
        ("kvpager:host_tier_blocks", (("state", "held"),)): ("gauge", t["held"]),
        ("kvpager:host_tier_blocks", (("state", "writing"),)): ("gauge", t["writing"]),
        ("kvpager:host_tier_blocks", (("state", "reading"),)): ("gauge", t["reading"]),
        ("kvpager:host_tier_stored_blocks_total", ()): ("counter", t["stored"]),
        ("kvpager:host_tier_loaded_blocks_total", ()): ("counter", t["loads"]),
        ("kvpager:host_tier_evictions_total", ()): ("counter", t["evicted"]),
        ("kvpager:host_tier_failed_stores_total", ()): ("counter", t["failed_stores"]),
        ("kvpager:host_tier_failed_loads_total", ()): ("counter", t["failed_loads"]),
        ("kvpager:host_tier_refused_stores_total", ()): ("counter", t["refused_stores"]),
        ("kvpager:host_tier_pending_hits_total", ()): ("counter", t["pending_hits"]),
        ("kvpager:host_tier_moved_up_blocks_total", ()): ("counter", t["moved_up"]),
        ("kvpager:host_tier_below_priority_blocks_total", ()): ("counter", t["below_priority"]),
    }
    tseen = set()
    for family in text_string_to_metric_families(ttext):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key not in texpected:
                errors.append(f"unexpected tier sample {key}")
                continue
            typ, want = texpected[key]
            if family.type != typ or not family.documentation:
                errors.append(f"{sample.name}: type {family.type} (expected {typ}) or empty HELP")
            if sample.value != float(want):
                errors.append(f"{key} = {sample.value!r}, expected {want}")
            tseen.add(key)
            checked += 1
    for key in texpected:
        if key not in tseen:
            errors.append(f"missing tier sample {key}")

    # The snapshot is consistent with itself (the JSON alone): the figures that are derived from others.
    usage = lookup(doc, "kv_cache.usage")
    if usage != lookup(doc, "kv_cache.used_blocks") / lookup(doc, "kv_cache.usable_blocks"):
        errors.append("kv_cache.usage is not used_blocks / usable_blocks")
    if lookup(doc, "preemptions.total") != lookup(doc, "preemptions.recompute") + lookup(doc, "preemptions.swap"):
        errors.append("preemptions.total is not recompute + swap")
    if lookup(doc, "swaps.out_bytes") != lookup(doc, "swaps.out_blocks") * lookup(doc, "kv_cache.block_bytes"):
        errors.append("swaps.out_bytes is not out_blocks x block_bytes")

    if errors:
        print("FAIL:\n  " + "\n  ".join(errors))
        return 1
    print(f"OK: {checked} samples parsed by prometheus_client match the JSON snapshot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
