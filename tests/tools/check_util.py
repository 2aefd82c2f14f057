# SPDX-License-Identifier: Apache-2.0
"""What the tools' check scripts share: run a command with a timeout, and fail with a message (exit 1)."""
import subprocess
import sys


def run(args, timeout=600):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)
