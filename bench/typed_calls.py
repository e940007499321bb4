"""What a typed job function adds per job, in one process pinned to one core: on the worker,
its handler's call through the signature (the payload's arguments decoded, the result
encoded) beside the plain no-op handler's call; on the producer, ``fn.call(i)`` (arguments
checked and encoded) beside the payload's JSON that an untyped enqueue makes.

    python -m bench.typed_calls                # 200,000 calls each, 11 rounds (~15 s)

Everything else a job costs (the enqueue's XADD, the worker's read, settle and ack) is the
same code for both kinds; ``bench.job_cpu --typed`` and ``bench.enqueue_cpu`` measure the
whole job. The figure is the fastest round's µs per call (``timeit``), the least disturbed
by other processes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import timeit
from collections.abc import Callable

from queueworks.examples import noop, typed_noop
from queueworks.queue.queues import payload_json


def per_call(call: Callable[[], object], n: int, rounds: int) -> float:
    """µs per ``call()``, the fastest of ``rounds`` rounds of ``n``."""
    return min(timeit.repeat(call, number=n, repeat=rounds)) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    subprocess.run(["taskset", "-pc", "0", str(os.getpid())], capture_output=True)
    typed = typed_noop.signature.handler()  # what a worker calls for typed_noop's jobs
    wire = {"args": [], "kwargs": {"n": 1}}  # typed_noop.call(1)'s payload, as read
    rows = {
        "worker: plain `noop(payload)`": per_call(lambda: noop(1), args.n, args.rounds),
        "worker: typed `typed_noop` job": per_call(lambda: typed(wire), args.n, args.rounds),
        "producer: `payload_json(i)`": per_call(lambda: payload_json(1), args.n, args.rounds),
        "producer: `typed_noop.call(i)`": per_call(lambda: typed_noop.call(1), args.n, args.rounds),
    }
    print(f"µs per call, fastest of {args.rounds} rounds of {args.n}, one core\n")
    print("| call | µs |")
    print("| --- | ---: |")
    for name, value in rows.items():
        print(f"| {name} | {value:.2f} |")


if __name__ == "__main__":
    main()
