"""The chaos and Redis-fault tests with a longer run, printing their figures.

    python -m bench.chaos --seconds 300 [--seed 7]

Runs tests/test_faults.py (real processes, a private Redis) with QUEUEWORKS_CHAOS_SECONDS
set, and prints the FIGURE lines the tests emit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from bench.common import ROOT


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=20261130)
    args = ap.parse_args()
    env = {
        **os.environ,
        "QUEUEWORKS_CHAOS_SECONDS": str(args.seconds),
        "QUEUEWORKS_CHAOS_SEED": str(args.seed),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/test_faults.py",
            "-q",
            "-s",
            "-n",
            "0",  # in one process: -s shows the FIGURE lines (xdist workers would hide them)
            "-p",
            "no:cacheprovider",
            "--timeout",
            str(int(args.seconds) + 600),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("FIGURE") or "passed" in line or "failed" in line:
            print(line)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
