# SPDX-License-Identifier: Apache-2.0
"""Command-line checks of kvpager-sim and kvpager-plan (issue 21; Python standard library only).

  cli_check.py plan_ranges PLAN       every floating option refused outside its range (NaN, infinities, byte counts
                                      past int64) with the range in the message and exit 2; valid extremes give
                                      non-negative byte counts
  cli_check.py sim_modes SIM          every --preemption, --admission and --composition value the help lists runs
                                      (adaptive included: the simulator gives the scheduler its cost model)
  cli_check.py sim_extremes SIM       --rate 1e-300 and --requests INT32_MAX refused at once; --rate 1e-6 finishes
                                      in seconds with a bounded history; a trace with max_model_len 0 runs
                                      --compute cpu; --max-model-len 2147483647 refused with its range
  cli_check.py fuzz SIM PLAN          random and extreme values of every numeric option of both tools: exit 0 or 2,
                                      never a signal or a hang, a refusal naming the option (bounded count and time)
"""
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

from check_util import check, fail  # tests/tools/check_util.py: the same FAIL line and exit status as the other checks


def run(args, timeout=120):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail("%s: no answer within %d s" % (" ".join(args), timeout))


def refused(p, what, option, range_text=None):
    check(p.returncode == 2, "%s: exit %d (expected 2): %s" % (what, p.returncode, p.stderr))
    check(option in p.stderr, "%s: the message does not name %s: %s" % (what, option, p.stderr))
    if range_text is not None:
        check(range_text in p.stderr, "%s: the message does not state the range %s: %s" % (what, range_text, p.stderr))


def plan_ranges(plan):
    bad = ["nan", "NaN", "inf", "-inf", "1e400", "-1", "0", "8589934592", "1e30", "abc", "1e"]
    for opt in ("--card-gib", "--reserve-gib", "--utilization"):
        for v in bad:
            if opt == "--reserve-gib" and v == "0":
                continue  # no reserve is valid
            p = run([plan, opt, v, "--json"])
            refused(p, "%s %s" % (opt, v), opt, "must be a finite number in")
    for v in ("1.5", "2", "-0.1"):
        refused(run([plan, "--utilization", v]), "--utilization " + v, "--utilization", "(0, 1]")
    for opt in ("--tp", "--kv-dtype-bytes", "--weight-dtype-bytes", "--block-size", "--seq-len"):
        for v in ("0", "-3", "1.5", "nan", "99999999999999999999"):
            refused(run([plan, opt, v]), "%s %s" % (opt, v), opt, "must be an integer in")
    refused(run([plan, "--model", "gpt-5"]), "--model gpt-5", "gpt-5")
    # The extremes that are accepted: every byte count in the JSON is a non-negative integer.
    p = run([plan, "--json", "--card-gib", "1048576", "--card-gib", "0.001", "--reserve-gib", "1048576", "--tp", "1",
             "--tp", "2147483647", "--block-size", "1048576", "--seq-len", "2147483647"])
    check(p.returncode == 0, "valid extremes: exit %d: %s" % (p.returncode, p.stderr))
    doc = json.loads(p.stdout)

    def walk(x, path):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, path + "." + k)
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, "%s[%d]" % (path, i))
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            check(x >= 0 and not (isinstance(x, float) and math.isnan(x)), "%s = %r" % (path, x))

    walk(doc, "doc")
    print("ok: plan refuses %d bad values with their ranges; extremes give non-negative counts" % (3 * len(bad) + 28))


SMALL = ["--json", "--quiet", "--requests", "30", "--rate", "2", "--blocks", "120", "--max-model-len", "1024"]


def sim_modes(sim):
    modes = ["cache_policy", "recompute", "swap", "adaptive"]
    for comp in ("hybrid_swap", "vllm_v1"):
        for mode in modes:
            for adm in ("watermark", "headroom"):
                for tuning in ("on", "off"):
                    args = [sim] + SMALL + ["--composition", comp, "--preemption", mode, "--admission", adm,
                                            "--tuning", tuning]
                    p = run(args)
                    what = "%s %s %s tuning %s" % (comp, mode, adm, tuning)
                    check(p.returncode == 0, "%s: exit %d: %s" % (what, p.returncode, p.stderr))
                    doc = json.loads(p.stdout)
                    check(doc["paged"]["completed"] + doc["paged"]["aborted"] == doc["workload"]["samples"],
                          "%s: requests lost" % what)
    # adaptive chooses by cost: a slow link makes every victim a recompute, a fast one lets it swap.
    base = [sim, "--json", "--quiet", "--requests", "30", "--rate", "2", "--blocks", "60", "--max-model-len", "1024",
            "--composition", "hybrid_swap", "--preemption", "adaptive", "--tuning", "off"]
    slow = json.loads(run(base + ["--link-gbps", "0.001"]).stdout)["paged"]
    fast = json.loads(run(base + ["--link-gbps", "10000"]).stdout)["paged"]
    check(slow["preemptions_swap"] == 0 and slow["preemptions_recompute"] > 0,
          "adaptive over a slow link swapped: %s" % slow)
    check(fast["preemptions_swap"] > 0, "adaptive over a fast link never swapped: %s" % fast)
    for opt in ("--link-gbps", "--prefill-tflops"):
        for v in ("0", "-1", "nan", "inf"):
            refused(run([sim, opt, v]), "%s %s" % (opt, v), opt, "must be a finite number in")
    print("ok: %d mode combinations run; adaptive swaps over a fast link (%d) and never over a slow one" %
          (2 * len(modes) * 4, fast["preemptions_swap"]))


def sim_extremes(sim):
    t0 = time.monotonic()
    refused(run([sim, "--rate", "1e-300"], timeout=20), "--rate 1e-300", "--rate", "[1e-06, 1e+06]")
    refused(run([sim, "--rate", "nan"], timeout=20), "--rate nan", "--rate")
    refused(run([sim, "--requests", "2147483647", "--max-steps", "1"], timeout=20), "--requests INT32_MAX",
            "--requests", "[1, 100000]")
    refused(run([sim, "--max-model-len", "2147483647"], timeout=20), "--max-model-len INT32_MAX", "--max-model-len",
            "[1, 16777216]")
    check(time.monotonic() - t0 < 20, "refusals took %.1f s" % (time.monotonic() - t0))
    # The lowest rate: ~1e6 idle steps between arrivals, skipped; the history stays bounded.
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        p = run([sim, "--json", "--quiet", "--requests", "40", "--rate", "1e-6", "--report", d], timeout=120)
        check(p.returncode == 0, "--rate 1e-6: exit %d: %s" % (p.returncode, p.stderr))
        doc = json.loads(p.stdout)
        paged, cont = doc["paged"], doc["contiguous"]
        check(paged["completed"] == doc["workload"]["samples"], "--rate 1e-6: not every request completed")
        check(paged["steps"] > 1e6, "--rate 1e-6: only %d steps" % paged["steps"])
        rows = sum(1 for _ in open(os.path.join(d, "steps.csv"))) - 1
        check(rows < 2 * 131072 + 10, "--rate 1e-6: %d CSV rows for %d steps" % (rows, paged["steps"]))
        spans = 0
        with open(os.path.join(d, "steps.csv")) as f:
            header = f.readline().strip().split(",")
            si = header.index("span")
            for line in f:
                spans += int(line.strip().split(",")[si])
        if doc["settings"]["history_stride"] == 1:
            check(spans == paged["steps"] + cont["steps"], "spans %d != steps %d + %d" %
                  (spans, paged["steps"], cont["steps"]))
        print("ok: --rate 1e-6 ran %d + %d steps in %.1f s, %d CSV rows" %
              (paged["steps"], cont["steps"], time.monotonic() - t0, rows))
        # A valid trace whose max_model_len is 0 (unbounded): --compute cpu runs it.
        trace = os.path.join(d, "len0.kvtrace")
        with open(trace, "w") as f:
            f.write("kvtrace 1\nworkload len0\nlevel manager\nparam num_blocks 64\nparam block_size 16\n"
                    "param max_model_len 0\nreq 1 11 20 5:40\nreq 2 12 9 5:40 6:17\nreq 3 13 30 7:3\nrun 0\n")
        p = run([sim, "--json", "--quiet", "--compute", "cpu", trace])
        check(p.returncode == 0, "max_model_len 0 trace: exit %d: %s" % (p.returncode, p.stderr))
        doc = json.loads(p.stdout)
        check(doc["compute"]["ok"] and doc["paged"]["completed"] == 3, "max_model_len 0 trace: %s" % doc["paged"])
        # the longest sequence the requests reach: request 2, 57 prompt tokens and 9 outputs
        check(doc["settings"]["max_model_len"] == 66, "max_model_len 0 trace: max_model_len %d" %
              doc["settings"]["max_model_len"])
    print("ok: extreme rates, request counts and lengths refused or run in bounded time")


def fuzz(sim, plan):
    rng = random.Random(int(os.environ.get("KVPAGER_FUZZ_SEED", "21")))
    budget_s = float(os.environ.get("KVPAGER_FUZZ_SECONDS", "60"))
    weird = ["0", "-0", "1", "-1", "2", "3", "7", "16", "1e-300", "1e-7", "1e-6", "0.5", "1e6", "1e7", "1e300",
             "nan", "-nan", "inf", "-inf", "2147483647", "2147483648", "-2147483648", "9223372036854775807",
             "9223372036854775808", "18446744073709551616", "4294967296", "0x10", "1.5", "", " ", "abc", "1e", "--"]
    sim_opts = ["--blocks", "--block-size", "--max-model-len", "--host-blocks", "--requests", "--rate", "--seed",
                "--max-steps", "--threads", "--link-gbps", "--prefill-tflops"]
    plan_opts = ["--card-gib", "--tp", "--utilization", "--kv-dtype-bytes", "--weight-dtype-bytes", "--block-size",
                 "--seq-len", "--reserve-gib"]
    t0 = time.monotonic()
    runs = 0
    while time.monotonic() - t0 < budget_s and runs < 1500:
        runs += 1
        if rng.random() < 0.5:
            exe, opts = sim, sim_opts
            # Keep valid runs small: the other options are drawn over a small workload that ends in bounded steps.
            args = [exe, "--quiet", "--json", "--requests", "8", "--max-steps", "3000"]
        else:
            exe, opts = plan, plan_opts
            args = [exe, "--json"]
        picked = rng.sample(opts, rng.randint(1, 3))
        for o in picked:
            v = rng.choice(weird) if rng.random() < 0.7 else str(rng.choice([rng.randint(-5, 5000),
                                                                               rng.uniform(-10, 1e4)]))
            args += [o, v]
        p = run(args, timeout=60)
        what = " ".join(args)
        check(p.returncode in (0, 2), "%s: exit %d (a signal is negative): %s" % (what, p.returncode, p.stderr[-500:]))
        if p.returncode == 2:
            check(any(o in p.stderr for o in picked) or "kvpager-" in p.stderr,
                  "%s: refused without naming an option: %s" % (what, p.stderr))
        elif "--json" in args:
            json.loads(p.stdout)  # a document, whatever the values
    print("ok: %d fuzzed command lines in %.1f s, every one answered 0 or 2" % (runs, time.monotonic() - t0))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "fuzz":
        fuzz(sys.argv[2], sys.argv[3])
    else:
        {"plan_ranges": plan_ranges, "sim_modes": sim_modes, "sim_extremes": sim_extremes}[cmd](sys.argv[2])
