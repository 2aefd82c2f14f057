# SPDX-License-Identifier: Apache-2.0
"""Checks of kvpager-sim (Python standard library only).

  sim_check.py report EXE      the default workload: its thresholds (paged waste <= 4%, contiguous waste >= 60%,
                               a larger batch for paged), --report's SVG parses as XML, the CSV agrees with --json,
                               the Prometheus text is there
  sim_check.py compute EXE     --compute cpu on a small workload (fp32 and bf16, with swaps and copies): exit 0, every
                               row checked and matching
  sim_check.py corruption EXE  --compute cpu with a KV value overwritten mid-run: exit 2 and the mismatch named
  sim_check.py host_tier EXE   --host-tier-blocks on the multi-turn workload: the tier serves what the small pool
                               evicted (hits by tier, loads, stores), every attention row still exact with its loads
                               run by the CPU executor (--compute cpu), bad tier options exit 2
  sim_check.py disaggregated EXE TRANSPORTS
                               --disaggregated over each transport of TRANSPORTS (inproc, ucx: comma-separated, what
                               the build has): every request finished on the decode instance with the single run's
                               output tokens, the bytes moved those of the tokens read at the pools' shape, every
                               received block checked, both instances empty; failed reads computed again, a corrupted
                               offer caught (exit 2 naming the request), the connection lost mid-run from either side
                               (--inject-disconnect: every request still ends with the same outputs, the rest computed
                               on the decode instance, both instances empty), bad option combinations exit 2
  sim_check.py disaggregated_groups EXE TRANSPORTS
                               --disaggregated --layers (KV cache groups, sliding windows): the same outputs as the
                               --layers run, the bytes those of the receiving tables' non-null entries (fewer than
                               every entry's), every received block checked, both instances empty; a chunking prefill
                               instance's released window blocks declined and computed on the decode instance; the
                               connection lost mid-run; bad combinations exit 2
"""
import csv
import json
import math
import sys
import tempfile
import xml.etree.ElementTree as ET


from check_util import check, run  # tests/tools/check_util.py


def close(a, b, tol=1e-5):
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def report(exe):
    with tempfile.TemporaryDirectory() as d:
        p = run([exe, "--json", "--quiet", "--report", d])
        check(p.returncode == 0, "exit %d: %s" % (p.returncode, p.stderr))
        doc = json.loads(p.stdout)
        paged, cont = doc["paged"], doc["contiguous"]
        samples = doc["workload"]["samples"]
        check(paged["completed"] == samples, "paged completed %d of %d" % (paged["completed"], samples))
        check(cont["completed"] == samples, "contiguous completed %d of %d" % (cont["completed"], samples))
        check(paged["internal_waste"] <= 0.04, "paged waste %.4f > 4%%" % paged["internal_waste"])
        check(cont["internal_waste"] >= 0.60, "contiguous waste %.4f < 60%%" % cont["internal_waste"])
        check(paged["mean_batch"] > cont["mean_batch"], "paged mean batch not larger")
        check(paged["peak_batch"] > cont["peak_batch"], "paged peak batch not larger")
        check(paged["prefix_hit_rate"] > 0, "no prefix hit in a workload of shared system prompts")
        check(paged["last_snapshot"]["steps"] == paged["steps"], "last snapshot is not the last step's")

        # The SVG is well-formed XML: an <svg> with two lines (paged, contiguous) in each of four panels.
        root = ET.parse(d + "/chart.svg").getroot()
        check(root.tag == "{http://www.w3.org/2000/svg}svg", "root is %s" % root.tag)
        lines = root.findall("{http://www.w3.org/2000/svg}polyline")
        check(len(lines) == 8, "%d polylines, expected 8" % len(lines))
        for line in lines:
            pts = line.get("points").split()
            check(len(pts) >= 2, "a line with fewer than 2 points")

        # The CSV agrees with --json: every summary field recomputed from the per-step rows.
        rows = {"paged": [], "contiguous": []}
        with open(d + "/steps.csv", newline="") as f:
            for r in csv.DictReader(f):
                rows[r["system"]].append(r)
        for name, summary in (("paged", paged), ("contiguous", cont)):
            rs = rows[name]
            check(len(rs) == summary["steps"], "%s: %d rows for %d steps" % (name, len(rs), summary["steps"]))
            check([int(r["step"]) for r in rs] == list(range(len(rs))), "%s: steps not 0..n-1" % name)
            running = [int(r["running"]) for r in rs]
            check(max(running) == summary["peak_batch"], "%s: peak batch" % name)
            check(close(sum(running) / len(rs), summary["mean_batch"]), "%s: mean batch" % name)
            check(int(rs[-1]["completed"]) == summary["completed"], "%s: completed" % name)
            check(close(int(rs[-1]["completed"]) / len(rs), summary["completed_per_step"]), "%s: per step" % name)
            alloc = sum(int(r["allocated_slots"]) for r in rs)
            stored = sum(int(r["stored_tokens"]) for r in rs)
            check(close(1 - stored / alloc, summary["internal_waste"]), "%s: internal waste" % name)
            check(close(sum(float(r["kv_usage"]) for r in rs) / len(rs), summary["mean_kv_usage"], 1e-4),
                  "%s: mean KV usage" % name)
            share = sum(int(r["stored_tokens"]) / int(r["pool_slots"]) for r in rs) / len(rs)
            check(close(share, summary["mean_token_share"]), "%s: token share" % name)
            check(close(max(float(r["external_fragmentation"]) for r in rs),
                        summary["peak_external_fragmentation"], 1e-4), "%s: peak fragmentation" % name)
            for level, n in summary["health_steps"].items():
                check(sum(1 for r in rs if r["health"] == level) == n, "%s: steps at %s" % (name, level))
        check(int(rows["paged"][-1]["swaps"]) == paged["swap_outs"] + paged["swap_ins"], "paged swaps")
        check(int(rows["paged"][-1]["preemptions"]) == paged["preemptions"], "paged preemptions")

        with open(d + "/metrics.prom") as f:
            prom = f.read()
        check("# TYPE" in prom and "kvpager:num_requests_running" in prom, "metrics.prom has no Prometheus text")
    print("ok: paged waste %.2f%%, contiguous waste %.2f%%, mean batch %.1f vs %.1f" %
          (100 * paged["internal_waste"], 100 * cont["internal_waste"], paged["mean_batch"], cont["mean_batch"]))


def compute(exe):
    # A small pool under a burst of arrivals: swaps (hybrid_swap), recomputes, copy-on-write of forks.
    for extra in (["--dtype", "fp32"], ["--dtype", "bf16", "--composition", "vllm_v1"]):
        p = run([exe, "--json", "--quiet", "--compute", "cpu", "--requests", "24", "--rate", "4", "--blocks", "90",
                 "--max-model-len", "1024", "--tuning", "off"] + extra)
        check(p.returncode == 0, "%s: exit %d: %s" % (extra, p.returncode, p.stderr))
        doc = json.loads(p.stdout)
        c, paged = doc["compute"], doc["paged"]
        # What the check must have gone through: prefix hits, copy-on-write copies, recomputes, and swaps where
        # the composition has a host pool.
        check(paged["prefix_hit_rate"] > 0 and c["block_copies"] > 0, "%s: no prefix hit or no copy" % extra)
        check(paged["preemptions_recompute"] > 0, "%s: no recompute" % extra)
        if "vllm_v1" not in extra:
            check(c["blocks_swapped_out"] > 0 and c["blocks_swapped_in"] > 0, "%s: no swap" % extra)
        check(c["ok"] and c["mismatches"] == 0, "%s: mismatches" % extra)
        check(c["rows_checked"] > 0 and c["requests_checked"] > 0, "%s: nothing checked" % extra)
        check(c["prefill_rows"] > 0 and c["rows"] > c["prefill_rows"], "%s: no prefill or no decode" % extra)
        print("ok %s: %d rows checked, max error %.3g, %d blocks swapped out, %d copies" %
              (extra, c["rows_checked"], c["max_error"], c["blocks_swapped_out"], c["block_copies"]))


def corruption(exe):
    p = run([exe, "--quiet", "--compute", "cpu", "--requests", "12", "--max-model-len", "1024",
             "--inject-corruption", "30"])
    check(p.returncode == 2, "a corrupted KV value exited %d (expected 2): %s" % (p.returncode, p.stderr))
    check("differ from the reference" in p.stderr, "no mismatch message: %s" % p.stderr)
    print("ok: " + p.stderr.strip())


def layers(exe):
    """--layers: the paged cache with KV cache groups at the same KV bytes, beside one group and contiguous."""
    for spec, groups, padding in [("full:1,swa128:1", 2, 0), ("gpt-oss-20b", 2, 0), ("gemma-3-27b", 7, 8),
                                  ("llama-4-scout", 4, 0), ("mistral-7b-v0.1", 1, 0)]:
        p = run([exe, "--quiet", "--json", "--requests", "120", "--layers", spec])
        check(p.returncode == 0, "%s: exit %d: %s" % (spec, p.returncode, p.stderr))
        d = json.loads(p.stdout)
        lay, g, one = d["layers"], d["paged_groups"], d["paged"]
        check(len(lay["groups"]) == groups and lay["padding_layers"] == padding,
              "%s: %s groups, %s padding layers (expected %d, %d)" % (spec, len(lay["groups"]), lay["padding_layers"],
                                                                      groups, padding))
        check(lay["blocks"] == d["settings"]["blocks"] * lay["num_layers"] // lay["group_size"],
              "%s: %s blocks at the same bytes" % (spec, lay["blocks"]))
        check(g["completed"] == one["completed"], "%s: %s completed with groups, %s with one" %
              (spec, g["completed"], one["completed"]))
        released = sum(x["released_blocks"] for x in g["groups"] if x["kind"] != "full")
        if spec not in ("llama-4-scout", "mistral-7b-v0.1"):  # windows of 8192 and 4096 > the workload's 2048
            check(released > 0, "%s: no window released a block: %s" % (spec, g["groups"]))
        if spec in ("full:1,swa128:1", "gpt-oss-20b"):  # a short window frees most blocks: more runs at once
            check(g["steps"] < one["steps"], "%s: groups took %s steps, one group %s" % (spec, g["steps"], one["steps"]))
        print("ok %s: %d groups, %d steps (one group %d), %d blocks released" %
              (spec, groups, g["steps"], one["steps"], released))
    for bad, what in [("full:0", "count"), ("swa:3", "unknown kind"), ("gpt-5", "kind:count"), ("full:2,mamba:1", "mamba"),
                      ("full:1,swa8:64", "more KV cache groups than max_groups (65)")]:
        p = run([exe, "--quiet", "--layers", bad])
        check(p.returncode == 2 and "--layers" in p.stderr and what in p.stderr,
              "--layers %s: exit %d, %s" % (bad, p.returncode, p.stderr))
    print("ok: bad --layers values exit 2 naming the option")


def multiturn(exe):
    """--workload multiturn: conversations come back with their whole history as prompt; a small pool evicts them."""
    runs = {}
    for blocks in (1030, 6000):
        p = run([exe, "--quiet", "--json", "--workload", "multiturn", "--requests", "200", "--blocks", str(blocks)])
        check(p.returncode == 0, "--blocks %d: exit %d: %s" % (blocks, p.returncode, p.stderr))
        d = json.loads(p.stdout)
        check(d["workload"]["name"] == "multiturn" and d["settings"]["workload"] == "multiturn", "not multiturn")
        check(d["paged"]["completed"] == 200 and d["workload"]["requests"] == 200, "turns lost: %s" % d["paged"])
        runs[blocks] = d
    small, big = runs[1030]["paged"], runs[6000]["paged"]
    # Later turns resend the conversation: with room for everything most prompt tokens hit the prefix cache.
    check(big["prefix_hit_rate"] > 0.75, "with room for everything only %.3f of prompt tokens hit" % big["prefix_hit_rate"])
    check(small["prefix_hit_rate"] < big["prefix_hit_rate"] - 0.1,
          "the small pool evicted nothing that came back: %.3f against %.3f" % (small["prefix_hit_rate"],
                                                                                big["prefix_hit_rate"]))
    check(runs[1030]["workload"] == runs[6000]["workload"], "the same seed gave two workloads")
    p = run([exe, "--quiet", "--workload", "multiturn", "--max-model-len", "6"])
    check(p.returncode == 2 and "--workload multiturn" in p.stderr, "no turn fits: exit %d, %s" % (p.returncode, p.stderr))
    p = run([exe, "--quiet", "--workload", "chat"])
    check(p.returncode == 2 and "--workload" in p.stderr, "--workload chat: exit %d, %s" % (p.returncode, p.stderr))
    print("ok multiturn: %.3f of prompt tokens hit at 1030 blocks, %.3f at 6000" % (small["prefix_hit_rate"],
                                                                                    big["prefix_hit_rate"]))


def host_tier(exe):
    """--host-tier-blocks: a host tier below the device pool on the multi-turn workload."""
    base = [exe, "--quiet", "--json", "--workload", "multiturn", "--requests", "400"]
    p = run(base)
    check(p.returncode == 0, "no tier: exit %d: %s" % (p.returncode, p.stderr))
    none = json.loads(p.stdout)["paged"]
    p = run(base + ["--blocks", "8000"])
    check(p.returncode == 0, "--blocks 8000: exit %d: %s" % (p.returncode, p.stderr))
    roomy = json.loads(p.stdout)["paged"]
    check(none["prefix_hit_tokens_host"] == 0 and none["tier_loads"] == 0 and none["tier_stores"] == 0,
          "a host tier without --host-tier-blocks: %s" % none)
    figures = {}
    for policy in ("lru", "arc"):
        for write in ("through", "back"):
            p = run(base + ["--host-tier-blocks", "4000", "--host-tier-policy", policy, "--host-tier-write", write])
            check(p.returncode == 0, "%s %s: exit %d: %s" % (policy, write, p.returncode, p.stderr))
            d = json.loads(p.stdout)
            g = d["paged"]
            check(d["settings"]["host_tier_policy"] == policy and d["settings"]["host_tier_write"] == write,
                  "settings not reported: %s" % d["settings"])
            check(g["completed"] == 400, "%s %s: turns lost" % (policy, write))
            # The device tier decides as before; the host tier serves part of what the device evicted.
            check(g["prefix_hit_tokens_device"] == none["prefix_hit_tokens_device"],
                  "the tier changed the device's hits: %d against %d" % (g["prefix_hit_tokens_device"],
                                                                        none["prefix_hit_tokens_device"]))
            check(g["prefix_hit_tokens_host"] > 0.2 * g["prefix_query_tokens"],
                  "%s %s: the host tier served only %d of %d prompt tokens" % (
                      policy, write, g["prefix_hit_tokens_host"], g["prefix_query_tokens"]))
            check(g["prefix_hit_tokens"] == g["prefix_hit_tokens_device"] + g["prefix_hit_tokens_host"],
                  "hits by tier do not add up")
            # A tier that holds everything closes the gap to a device pool with room for everything.
            check(g["prefix_hit_tokens"] >= roomy["prefix_hit_tokens"] - 0.01 * g["prefix_query_tokens"],
                  "%s %s: %d tokens hit with the tier, %d with room for everything" % (
                      policy, write, g["prefix_hit_tokens"], roomy["prefix_hit_tokens"]))
            check(g["prefix_hit_tokens_host"] == 16 * g["tier_loads"], "host hit tokens are not loads x block size")
            check(g["prompt_tokens_computed"] == g["prefix_query_tokens"] - g["prefix_hit_tokens"],
                  "computed prompt tokens")
            check(0 < g["tier_stores_per_reused_block"] <= 1.0,
                  "%s %s: %.3f stores per reused block" % (policy, write, g["tier_stores_per_reused_block"]))
            figures[(policy, write)] = g["prefix_hit_tokens_host"] / g["prefix_query_tokens"]
    # End to end: the loads and stores run on real KV pools by the CPU executor, every attention row checked.
    for write in ("back", "through"):
        p = run([exe, "--quiet", "--json", "--workload", "multiturn", "--requests", "100", "--blocks", "300",
                 "--host-tier-blocks", "600", "--host-tier-write", write, "--compute", "cpu"])
        check(p.returncode == 0, "--compute cpu with a host tier (%s): exit %d: %s" % (write, p.returncode, p.stderr))
        d = json.loads(p.stdout)
        c, g = d["compute"], d["paged"]
        check(c["mismatches"] == 0 and c["rows_checked"] > 10000 and c["requests_checked"] == 100,
              "--compute cpu (%s): %s" % (write, c))
        check(g["tier_loads"] > 100 and c["blocks_swapped_in"] >= g["tier_loads"],
              "--compute cpu (%s): %d loads, %d blocks moved in" % (write, g["tier_loads"], c["blocks_swapped_in"]))
    # KV cache groups (--layers) with the tier: each group's blocks stored and loaded with their group's layers. The
    # groups' pool holds more of the conversations (windows free their early blocks), so the tier has less to serve;
    # with it both runs reach what the tier holds.
    for spec in ("full:1,swa128:1", "gpt-oss-20b"):
        for policy in ("lru", "arc"):
            args = base + ["--layers", spec]
            p = run(args)
            check(p.returncode == 0, "--layers %s: exit %d: %s" % (spec, p.returncode, p.stderr))
            plain = json.loads(p.stdout)["paged_groups"]
            p = run(args + ["--host-tier-blocks", "4000", "--host-tier-policy", policy])
            check(p.returncode == 0, "--layers %s with a tier: exit %d: %s" % (spec, p.returncode, p.stderr))
            d = json.loads(p.stdout)
            g, one = d["paged_groups"], d["paged"]
            check(g["completed"] == 400 and plain["completed"] == 400, "--layers %s: turns lost" % spec)
            check(plain["prefix_hit_tokens_host"] == 0 and plain["tier_loads"] == 0, "a tier without one")
            check(g["prefix_hit_tokens"] == g["prefix_hit_tokens_device"] + g["prefix_hit_tokens_host"],
                  "--layers %s: hits by tier do not add up" % spec)
            check(g["prefix_hit_tokens_host"] > 0 and g["tier_loads"] > 0 and g["tier_stores"] > 0 and
                  g["prefix_hit_tokens"] > plain["prefix_hit_tokens"] + 0.1 * g["prefix_query_tokens"] and
                  g["prefix_hit_tokens"] >= 0.99 * one["prefix_hit_tokens"],
                  "--layers %s %s: %d tokens hit (%d from the tier), %d without the tier, %d by one group with it" % (
                      spec, policy, g["prefix_hit_tokens"], g["prefix_hit_tokens_host"], plain["prefix_hit_tokens"],
                      one["prefix_hit_tokens"]))
            check(g["prompt_tokens_computed"] == g["prefix_query_tokens"] - g["prefix_hit_tokens"],
                  "--layers %s: computed prompt tokens" % spec)
            print("ok --layers %s, %s tier: %.3f of prompt tokens hit (%.3f from the tier; %.3f without it), %.2f "
                  "stores per reused block" % (
                      spec, policy, g["prefix_hit_tokens"] / g["prefix_query_tokens"],
                      g["prefix_hit_tokens_host"] / g["prefix_query_tokens"],
                      plain["prefix_hit_tokens"] / plain["prefix_query_tokens"], g["tier_stores_per_reused_block"]))
    for bad, what in ((["--host-tier-blocks", "-1"], "--host-tier-blocks"),
                      (["--host-tier-blocks", "100", "--composition", "vllm_v1"], "--host-tier-blocks"),
                      (["--host-tier-blocks", "100", "--host-tier-policy", "fifo"], "--host-tier-policy"),
                      (["--host-tier-blocks", "100", "--host-tier-write", "around"], "--host-tier-write"),
                      (["--host-tier-blocks", "100", "--host-tier-store-threshold", "0"], "--host-tier-store-threshold")):
        p = run([exe, "--quiet"] + bad)
        check(p.returncode == 2 and what in p.stderr, "%s: exit %d, %s" % (bad, p.returncode, p.stderr))
    print("ok host_tier: host hits %s; --compute cpu exact with %d loads" % (
        ", ".join("%s/%s %.3f" % (k[0], k[1], v) for k, v in sorted(figures.items())), g["tier_loads"]))


def lost_connection(what, g, single, w, hook):
    """The figures of a run whose connection went away at `hook` (prefill:N or decode:N)."""
    side, n = hook.split(":")
    check(g["link_lost"] and g["ok"], "%s: %s" % (what, {k: g[k] for k in ("link_lost", "ok", "pools_empty")}))
    check(g["finished"] + g["rejected"] == w["samples"] and g["finished"] == single["completed"] and
          g["rejected"] == single["aborted"] and g["output_tokens"] == single["output_tokens"],
          "%s: %d finished, %d rejected (%s), %d output tokens; the single run %d, %d, %d" % (
              what, g["finished"], g["rejected"], g["rejected_reasons"], g["output_tokens"], single["completed"],
              single["aborted"], single["output_tokens"]))
    # Requests not offered (or offered and not received) are computed on the decode instance; an offer received and
    # not read fails its wait (external_failures): each a read that failed or could not start, or a released window.
    check(g["recomputed_locally"] > 0 and g["offered"] + g["recomputed_locally"] >= w["requests"],
          "%s: %d offered, %d computed locally of %d requests" % (what, g["offered"], g["recomputed_locally"],
                                                                w["requests"]))
    check(g["external_failures"] == g["reads_failed"] + g["declined_released"], "%s: failures %s" % (what, g))
    if side == "prefill":
        check(g["offered"] == int(n), "%s: %d offers went through" % (what, g["offered"]))
    else:
        check(g["reads"] >= int(n), "%s: %d reads started" % (what, g["reads"]))
    # Everything the prefill instance held was released; no sequence, block or transfer is left on either side.
    check(g["pools_empty"] == {"prefill": True, "decode": True} and g["check"]["mismatches"] == 0,
          "%s: pools %s, check %s" % (what, g["pools_empty"], g["check"]))
    print("ok %s: %d offers, %d reads, %d failed or not started, %d computed locally, %d held requests released" % (
        what, g["offered"], g["reads"], g["reads_failed"], g["recomputed_locally"], g["released_on_loss"]))


def disaggregated(exe, transports):
    """--disaggregated: a prefill and a decode instance, real KV transfers between real pools."""
    layers, kv_heads, head_dim, fp16 = 3, 32, 128, 2  # --disagg-layers 3 of Llama-2-7B's layers, in fp16
    token_bytes = layers * 2 * kv_heads * head_dim * fp16  # K and V of one token over the pools' layers
    block_size = 16
    # A small pool under a burst of arrivals: both instances preempt (swaps with hybrid_swap, recomputes with
    # vllm_v1), the decode instance's own prefix cache serves shared system prompts (those offers are declined), and
    # requests longer than --max-model-len end with a reason on both runs alike.
    base = [exe, "--quiet", "--json", "--requests", "48", "--rate", "2", "--blocks", "120", "--max-model-len", "1024",
            "--tuning", "off", "--disaggregated", "--disagg-layers", str(layers)]
    for transport in transports:
        for composition in ("hybrid_swap", "vllm_v1"):
            what = "%s, %s" % (transport, composition)
            p = run(base + ["--kv-transport", transport, "--composition", composition], timeout=120)
            check(p.returncode == 0, "%s: exit %d: %s" % (what, p.returncode, p.stderr))
            d = json.loads(p.stdout)
            g, single, w = d["disaggregated"], d["paged"], d["workload"]
            check(g["transport"] == transport and g["bytes_per_token"] == token_bytes, "%s: settings %s" % (what, g))
            # Every request ended: finished on the decode instance as in the single run, or ended for the same reason.
            check(g["finished"] + g["rejected"] == w["samples"] == g["samples"], "%s: samples lost: %s" % (what, g))
            check(g["finished"] == single["completed"] and g["rejected"] == single["aborted"],
                  "%s: %d finished, %d rejected (%s); the single run %d, %d" % (
                      what, g["finished"], g["rejected"], g["rejected_reasons"], single["completed"],
                      single["aborted"]))
            check(g["finished"] > 0 and g["output_tokens"] == single["output_tokens"],
                  "%s: %d output tokens on the decode instance, %d in the single run" % (
                      what, g["output_tokens"], single["output_tokens"]))
            # Every request was offered with its whole prompt; what was read is whole blocks below each prompt's
            # last token (after the decode instance's own prefix hit), and its bytes are those tokens' KV.
            check(g["offered"] == w["requests"] and g["kv_offered_tokens"] == w["prompt_tokens"],
                  "%s: %d offers of %d tokens for %d requests of %d prompt tokens" % (
                      what, g["offered"], g["kv_offered_tokens"], w["requests"], w["prompt_tokens"]))
            check(g["reads"] > 0 and g["kv_read_tokens"] > 0 and g["kv_read_tokens"] % block_size == 0 and
                  g["kv_read_tokens"] <= g["kv_offered_tokens"] - g["offered"],
                  "%s: %d tokens read in %d reads" % (what, g["kv_read_tokens"], g["reads"]))
            check(g["kv_transfer_bytes"] == g["kv_read_tokens"] * token_bytes,
                  "%s: %d bytes moved for %d tokens read (%d bytes each)" % (
                      what, g["kv_transfer_bytes"], g["kv_read_tokens"], token_bytes))
            check(sum(q["read_tokens"] for q in g["per_request"]) == g["kv_read_tokens"], "%s: per request" % what)
            check(g["reads"] + g["declined"] <= g["offered"] and g["reads_failed"] == 0 and
                  g["external_failures"] == 0 and g["recomputed_locally"] == 0, "%s: transfers failed: %s" % (what, g))
            # The received KV, checked block by block against what the prefill instance computed.
            c = g["check"]
            check(c["ok"] and c["mismatches"] == 0 and c["reads_checked"] == g["reads"] and
                  c["blocks_checked"] * block_size == g["kv_read_tokens"], "%s: check %s" % (what, c))
            check(g["pools_empty"] == {"prefill": True, "decode": True} and g["ok"], "%s: pools %s" % (what, g))
            # Times: each read's wall-clock time is part of its request's time to first token.
            read = [q for q in g["per_request"] if q["read_tokens"] > 0]
            check(all(0 < q["transfer_s"] < q["ttft_s"] for q in read) and 0 < g["mean_transfer_share_of_ttft"] < 1,
                  "%s: transfer times %s" % (what, read[:3]))
            check(g["decode"]["preemptions"] > 0, "%s: no preemption on the decode instance" % what)
            print("ok %s: %d samples finished, %d tokens (%.1f MiB) read in %d reads, %.3f ms a read, %.2f%% of the "
                  "time to first token, %d blocks checked" % (
                      what, g["finished"], g["kv_read_tokens"], g["kv_transfer_bytes"] / 1048576.0, g["reads"],
                      1e3 * g["mean_transfer_s"], 100 * g["mean_transfer_share_of_ttft"], c["blocks_checked"]))
    # Reads that fail: the decode instance computes those prompts itself; the outputs do not change.
    p = run(base + ["--kv-transport", "inproc", "--inject-read-failures", "3"])
    check(p.returncode == 0, "failed reads: exit %d: %s" % (p.returncode, p.stderr))
    d = json.loads(p.stdout)
    g = d["disaggregated"]
    check(g["external_failures"] > 0 and g["reads_failed"] == g["external_failures"] and g["ok"] and
          g["finished"] == d["paged"]["completed"] and g["output_tokens"] == d["paged"]["output_tokens"],
          "failed reads: %s" % {k: g[k] for k in ("reads", "reads_failed", "external_failures", "finished", "ok")})
    print("ok: %d of %d reads failed, computed on the decode instance, the same outputs" % (g["reads_failed"], g["reads"]))
    # A byte changed in an offered block on the prefill side: the decode instance's check names the request.
    for transport in transports:
        p = run(base + ["--kv-transport", transport, "--inject-offer-corruption", "4"])
        check(p.returncode == 2 and "--disaggregated" in p.stderr and "request " in p.stderr and
              "is not what computing the token writes" in p.stderr,
              "corrupted offer (%s): exit %d: %s" % (transport, p.returncode, p.stderr))
        check(json.loads(p.stdout)["disaggregated"]["check"]["mismatches"] > 0, "corrupted offer: no mismatch")
    print("ok: a corrupted offer exits 2: " + p.stderr.strip().splitlines()[0])
    # The prefill instance registers its pools again after its 3rd offer (new remote keys): the offers made before
    # and not yet read are refused by the receiver (their keys no longer match) and computed on the decode instance;
    # later reads go through the new keys, checked block by block; the outputs do not change.
    for transport in transports:
        what = "registered again (%s)" % transport
        p = run(base + ["--kv-transport", transport, "--inject-reregister", "3"], timeout=120)
        check(p.returncode == 0, "%s: exit %d: %s" % (what, p.returncode, p.stderr))
        d = json.loads(p.stdout)
        g, single = d["disaggregated"], d["paged"]
        check(g["declined_stale"] > 0 and g["external_failures"] == g["declined_stale"] and g["reads_failed"] == 0 and
              g["declined"] >= g["declined_stale"] and g["reads"] + g["declined"] <= g["offered"],
              "%s: %s" % (what, {k: g[k] for k in ("reads", "declined", "declined_stale", "reads_failed",
                                                   "external_failures")}))
        check(g["finished"] == single["completed"] and g["rejected"] == single["aborted"] and
              g["output_tokens"] == single["output_tokens"], "%s: %d finished, %d output tokens; single %d, %d" % (
                  what, g["finished"], g["output_tokens"], single["completed"], single["output_tokens"]))
        c = g["check"]
        check(c["ok"] and c["mismatches"] == 0 and c["reads_checked"] == g["reads"] > 0 and
              g["pools_empty"] == {"prefill": True, "decode": True} and g["ok"], "%s: check %s, pools %s" % (
                  what, c, g["pools_empty"]))
        print("ok %s: %d offers refused for stale keys and computed here, %d reads checked (the later ones through "
              "the new keys), the same outputs" % (what, g["declined_stale"], g["reads"]))
    # The connection lost mid-run, closed by the prefill side after its 5th offer or by the decode side with its 5th
    # read in flight: every request still ends as in the single run, the decode instance computes the rest.
    for transport in transports:
        for hook in ("prefill:5", "decode:5"):
            what = "lost connection (%s, %s)" % (transport, hook)
            p = run(base + ["--kv-transport", transport, "--inject-disconnect", hook], timeout=120)
            check(p.returncode == 0, "%s: exit %d: %s" % (what, p.returncode, p.stderr))
            d = json.loads(p.stdout)
            lost_connection(what, d["disaggregated"], d["paged"], d["workload"], hook)
    # Options combined wrongly: exit 2 naming the option.
    bad = [(["--kv-transport", "inproc"], "--kv-transport needs --disaggregated"),
           (["--disagg-layers", "4"], "--disagg-layers needs --disaggregated"),
           (["--inject-disconnect", "prefill:3"], "--inject-disconnect needs --disaggregated"),
           (["--inject-reregister", "3"], "--inject-reregister needs --disaggregated"),
           (["--disaggregated", "--inject-disconnect", "both:3"], "--inject-disconnect"),
           (["--disaggregated", "--compute", "cpu"], "--compute cpu"),
           (["--disaggregated", "--max-steps", "10"], "--max-steps"),
           (["--disaggregated", "--block-size", "64"], "--block-size"),
           (["--disaggregated", "--blocks", "4000"], "--blocks"),
           (["--disaggregated", "--disagg-layers", "33"], "--disagg-layers"),
           (["--disaggregated", "--kv-transport", "tcp"], "--kv-transport")]
    if "ucx" not in transports:
        bad.append((["--disaggregated", "--kv-transport", "ucx"], "this build has no UCX"))
    for args, what in bad:
        p = run([exe, "--quiet"] + args)
        check(p.returncode == 2 and what in p.stderr, "%s: exit %d, %s" % (args, p.returncode, p.stderr))
    print("ok: %d bad option combinations exit 2 naming the option" % len(bad))


def group_layers(lay, per_block):
    """The transfer's layers of a --layers run: each group's first `per_block` layers (a padded group has fewer)."""
    n = 0
    for k in lay["kinds"]:
        left = k["layers"]
        while left > 0:
            n += min(left, lay["group_size"], per_block)
            left -= lay["group_size"]
    return n


def disaggregated_groups(exe, transports):
    """--disaggregated --layers: both instances over the --layers run's KV cache groups."""
    layer_token_bytes, block_size = 2 * 32 * 128 * 2, 16  # one Llama-2-7B layer's K and V of a token, in fp16
    base = [exe, "--quiet", "--json", "--requests", "48", "--rate", "2", "--blocks", "120", "--max-model-len", "1024",
            "--tuning", "off", "--disaggregated"]
    # gpt-oss-20b: a 128-token window beside full attention; full:1,swa24:1 with a prefill instance that computes 24
    # tokens a step (its prompts chunked: it releases window blocks a receiver may still need); swa24:3,full:2: a
    # padded window group (2 layers of a group's block in the pools, 1 in the padded group), vllm_v1 (no host pool).
    cases = [("gpt-oss-20b", [], "hybrid_swap", 1),
             ("full:1,swa24:1", ["--prefill-token-budget", "24"], "hybrid_swap", 1),
             ("swa24:3,full:2", ["--disagg-layers", "2"], "vllm_v1", 2)]
    for transport in transports:
        for spec, extra, composition, per_block in cases:
            what = "%s, %s, %s" % (spec, transport, composition)
            p = run(base + ["--layers", spec, "--kv-transport", transport, "--composition", composition] + extra,
                    timeout=120)
            check(p.returncode == 0, "%s: exit %d: %s" % (what, p.returncode, p.stderr))
            d = json.loads(p.stdout)
            g, single, w, lay = d["disaggregated"], d["paged_groups"], d["workload"], d["layers"]
            layers = group_layers(lay, per_block)
            check(g["tables"] == len(lay["groups"]) and g["layers"] == per_block and g["transfer_layers"] == layers and
                  g["layer_block_bytes"] == block_size * layer_token_bytes, "%s: settings %s" % (what, {
                      k: g[k] for k in ("tables", "layers", "transfer_layers", "layer_block_bytes")}))
            # Every request ended as in the --layers run (the same groups, pool and scheduler).
            check(g["finished"] + g["rejected"] == w["samples"] and g["finished"] == single["completed"] and
                  g["rejected"] == single["aborted"] and g["finished"] > 0 and
                  g["output_tokens"] == single["output_tokens"],
                  "%s: %d finished, %d rejected (%s), %d output tokens; the --layers run %d, %d, %d" % (
                      what, g["finished"], g["rejected"], g["rejected_reasons"], g["output_tokens"],
                      single["completed"], single["aborted"], single["output_tokens"]))
            check(g["offered"] == w["requests"] and g["reads"] > 0, "%s: %d offers, %d reads" % (
                what, g["offered"], g["reads"]))
            # The bytes are those the receiving tables' non-null entries hold (each entry a block of every layer of
            # its table), fewer than reading every entry of every table (a window's released entries are null).
            every = g["kv_read_tokens"] * layers * layer_token_bytes
            check(g["kv_transfer_bytes"] == g["kv_read_layer_blocks"] * g["layer_block_bytes"] and
                  0 < g["kv_transfer_bytes"] < every and
                  g["kv_read_entries"] < g["kv_read_tokens"] // block_size * g["tables"],
                  "%s: %d bytes moved for %d layer blocks, %d entries; every entry would be %d bytes" % (
                      what, g["kv_transfer_bytes"], g["kv_read_layer_blocks"], g["kv_read_entries"], every))
            c = g["check"]
            check(c["ok"] and c["mismatches"] == 0 and c["reads_checked"] == g["reads"] and
                  c["blocks_checked"] == g["kv_read_entries"], "%s: check %s" % (what, c))
            # A read the decode instance could not plan (a window block the prefill instance released) is declined
            # and computed here: with a prefill instance that chunks its prompts only.
            check(g["external_failures"] == g["reads_failed"] + g["declined_released"] and g["reads_failed"] == 0,
                  "%s: failures %s" % (what, {k: g[k] for k in ("external_failures", "reads_failed",
                                                                 "declined_released")}))
            if extra[:1] == ["--prefill-token-budget"]:
                check(g["declined_released"] > 0 and g["declined"] >= g["declined_released"],
                      "%s: no released window block declined (%d)" % (what, g["declined_released"]))
            else:
                check(g["declined_released"] == 0, "%s: %d declined" % (what, g["declined_released"]))
            check(g["pools_empty"] == {"prefill": True, "decode": True} and g["ok"], "%s: pools %s" % (
                what, g["pools_empty"]))
            print("ok %s: %d tables, %d layers read, %d samples finished, %.1f of %.1f MiB (%d of %d entries) read "
                  "in %d reads, %d declined for a released window block, %d blocks checked" % (
                      what, g["tables"], layers, g["finished"], g["kv_transfer_bytes"] / 1048576.0, every / 1048576.0,
                      g["kv_read_entries"], g["kv_read_tokens"] // block_size * g["tables"], g["reads"],
                      g["declined_released"], c["blocks_checked"]))
        # The connection lost mid-run with groups and released windows.
        for hook in ("prefill:20", "decode:15"):
            what = "groups, lost connection (%s, %s)" % (transport, hook)
            p = run(base + ["--layers", "full:1,swa24:1", "--prefill-token-budget", "24", "--kv-transport", transport,
                            "--inject-disconnect", hook], timeout=120)
            check(p.returncode == 0, "%s: exit %d: %s" % (what, p.returncode, p.stderr))
            d = json.loads(p.stdout)
            lost_connection(what, d["disaggregated"], d["paged_groups"], d["workload"], hook)
    # Combinations that do not run: exit 2 naming the option.
    bad = [(["--disaggregated", "--layers", "full:1,swa128:1", "--disagg-layers", "2"], "--disagg-layers"),
           (["--disaggregated", "--layers", "gemma-3-27b"], "--blocks"),
           (["--disaggregated", "--layers", "gpt-oss-20b", "--host-tier-blocks", "64"], "--host-tier-blocks"),
           (["--layers", "gpt-oss-20b", "--prefill-token-budget", "64"],
            "--prefill-token-budget needs --disaggregated")]
    for args, what in bad:
        p = run([exe, "--quiet"] + args)
        check(p.returncode == 2 and what in p.stderr, "%s: exit %d, %s" % (args, p.returncode, p.stderr))
    print("ok: %d bad option combinations exit 2 naming the option" % len(bad))


if __name__ == "__main__":
    if sys.argv[1] in ("disaggregated", "disaggregated_groups"):
        {"disaggregated": disaggregated, "disaggregated_groups": disaggregated_groups}[sys.argv[1]](
            sys.argv[2], sys.argv[3].split(","))
    else:
        {"report": report, "compute": compute, "corruption": corruption, "layers": layers,
         "multiturn": multiturn, "host_tier": host_tier}[sys.argv[1]](sys.argv[2])
