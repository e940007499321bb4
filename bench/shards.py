"""Aggregate throughput of concurrent tasks on a 1-shard vs a 3-shard Redis Cluster.

    python -m bench.shards                      # 6 tasks x 20,000 subtasks, 6 workers, 3 rounds
    python -m bench.shards --tasks 6 --n 20000 --workers 6 --repeat 3 --handler noop

Both clusters are started side by side in one run (``tests.cluster_fixtures.LocalCluster``:
one primary holding all 16,384 slots, and three primaries), and the rounds alternate
between them so that the machine's noise hits both alike. In each round: a controller and
``--workers`` idle workers on that cluster; ``--tasks`` tasks (each ``max_nodes`` =
workers / tasks) submitted, with task ids chosen so that on the 3-shard cluster they spread
evenly over the shards; then a controller starts and hands them out all at once.
Aggregate throughput = all subtasks / (last task finished - first task started). Also the
CPU each Redis process spent per second of that window (``INFO cpu``): with one shard, one
process does all the Redis work.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from typing import Any

from bench.common import Procs, wait_for
from queueworks import Client, TaskSpec
from queueworks.contrib.redis_server import RedisServer
from queueworks.transport.connection import connect
from queueworks.transport.topology import SlotMap, read_slot_map, slot_of
from tests.cluster_fixtures import LocalCluster


def task_ids(slot_map: SlotMap, n: int) -> list[str]:
    """``n`` task ids, round-robin over the primaries of ``slot_map``."""
    nodes = sorted(slot_map.primaries)
    out: list[str] = []
    while len(out) < n:
        tid = uuid.uuid4().hex[:16]
        if slot_map.owner(slot_of(tid)) == nodes[len(out) % len(nodes)]:
            out.append(tid)
    return out


def cpu_seconds(nodes: list[RedisServer]) -> dict[int, float]:
    out = {}
    for node in nodes:
        with node.client() as c:
            info: Any = c.info("cpu")
            out[node.port] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return out


def one_round(
    cluster: LocalCluster, tasks: int, n: int, workers: int, handler: str
) -> tuple[float, list[float]]:
    """(subtasks/s, Redis CPU per primary as a fraction of one core)."""
    prefix = f"s{uuid.uuid4().hex[:6]}"
    procs = Procs(cluster.url, prefix)
    client = Client.from_url(cluster.url, prefix=prefix)
    rc = connect(cluster.url)
    try:
        for i in range(workers):
            procs.worker(f"w{i}")
        wait_for(lambda: rc.zcard(f"{prefix}:workers") >= workers, 60)
        ids = task_ids(read_slot_map(rc), tasks)
        per_task = max(1, workers // tasks)
        handles = [
            client.submit(
                TaskSpec(
                    name=f"shard-bench-{k}",
                    handler=f"queueworks.examples:{handler}",
                    subtasks=({"x": i} for i in range(n)),
                    min_nodes=1,
                    max_nodes=per_task,
                ),
                task_id=tid,
            )
            for k, tid in enumerate(ids)
        ]
        # All queued before the controller starts: submitting is not part of the window.
        cpu0 = cpu_seconds(cluster.primaries())
        procs.spawn("controller")
        statuses = [h.wait(timeout=900, poll=0.02) for h in handles]
        cpu1 = cpu_seconds(cluster.primaries())
        for st in statuses:
            assert (st.done, st.dead) == (n, 0), st
        started = min(st.started_at or st.created_at for st in statuses)
        finished = max(st.finished_at or 0.0 for st in statuses)
        rate = tasks * n / (finished - started)
        # Redis is idle outside the window but for heartbeats: charge its CPU to the window
        cpu = [(cpu1[p] - cpu0[p]) / (finished - started) for p in sorted(cpu1)]
        return rate, cpu
    finally:
        procs.stop_all()
        client.close()
        rc.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--n", type=int, default=20_000, help="subtasks per task")
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--handler", default="noop", help="queueworks.examples handler")
    args = ap.parse_args()
    results: dict[int, list[tuple[float, list[float]]]] = {1: [], 3: []}
    with LocalCluster(1) as one, LocalCluster(3) as three:
        for r in range(args.repeat):
            for shards, cluster in ((1, one), (3, three)) if r % 2 == 0 else ((3, three), (1, one)):
                got = one_round(cluster, args.tasks, args.n, args.workers, args.handler)
                results[shards].append(got)
                cpu = " ".join(f"{c:.0%}" for c in got[1])
                print(
                    f"round {r + 1}: {shards} shard(s): {got[0]:,.0f} subtasks/s, Redis CPU {cpu}"
                )
    print()
    print(f"{args.tasks} tasks x {args.n:,} `{args.handler}` subtasks, {args.workers} workers")
    print()
    print(
        "| shards | aggregate subtasks/s (median) | min … max | Redis CPU per primary "
        "(of one core) | Redis CPU per subtask |"
    )
    print("| --- | --- | --- | --- | --- |")
    for shards, rows in results.items():
        rates = [x for x, _ in rows]
        cpu = [statistics.median(c[i] for _, c in rows) for i in range(shards)]
        per = statistics.median(sum(c) / x * 1e6 for x, c in rows)
        print(
            f"| {shards} | {statistics.median(rates):,.0f} | {min(rates):,.0f} … "
            f"{max(rates):,.0f} | {' / '.join(f'{c:.0%}' for c in cpu)} | {per:.1f} µs |"
        )
    base = statistics.median(x for x, _ in results[1])
    print(f"\n3 shards / 1 shard: {statistics.median(x for x, _ in results[3]) / base:.2f}x")


if __name__ == "__main__":
    main()
