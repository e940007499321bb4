"""Run one workload for one peer, inside that peer's venv; the last stdout line is the result.

    python -m bench.peers.driver PEER WORKLOAD --url redis://... --logdir DIR --params '{...}'

PEER is a module suffix (``queueworks``, ``rq``, ``rq-simple``, ``celery``, ...); the part
after a dash is the variant, passed to the peer's ``Driver``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from bench.peers.harness import WORKLOADS

RESULT_PREFIX = "RESULT "


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("peer")
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--url", required=True)
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--params", default="{}")
    args = ap.parse_args(argv)
    module, _, variant = args.peer.partition("-")
    os.environ["BENCH_REDIS_URL"] = args.url  # Celery and Dramatiq build their app at import
    driver_cls = importlib.import_module(f"bench.peers.peer_{module}").Driver
    peer = driver_cls(args.url, Path(args.logdir), variant or None)
    try:
        result = WORKLOADS[args.workload](peer, **json.loads(args.params))
    finally:
        peer.stop_workers(grace=0)
        peer.close()
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
