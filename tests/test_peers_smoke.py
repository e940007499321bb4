"""The peers benchmark (``bench/peers``): the queueworks driver through every workload at
tiny sizes, each on a fresh private redis-server, and the report built from the results.

No venvs are built here (the peers themselves run only in ``python -m bench.peers.run``).
Budget: ~15 s (five boots of a controller and one or two workers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from bench.peers import harness, report
from bench.peers.peer_queueworks import Driver
from queueworks.contrib.redis_server import RedisServer

PeerFactory = Callable[[], AbstractContextManager[Driver]]


@pytest.fixture
def fresh_peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PeerFactory:
    @contextmanager
    def make() -> Iterator[Driver]:
        with RedisServer() as server:
            monkeypatch.setenv("BENCH_REDIS_URL", server.url)
            peer = Driver(server.url, tmp_path)
            try:
                yield peer
            finally:
                peer.stop_workers(grace=0)
                peer.close()

    return make


def _doc(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "date": "today",
        "command": "python -m bench.peers.run --quick",
        "quick": True,
        "duration_s": 60.0,
        "params": {
            "throughput_n": 400,
            "throughput_budget_s": 60.0,
            "enqueue_n": 2000,
            "latency_rate": 40.0,
            "latency_count": 20,
            "give_up_s": 30.0,
        },
        "machine": {
            "cpu": "cpu",
            "cores": 2,
            "memory_gib": 1.0,
            "os": "linux",
            "python": "3.11",
            "redis_server": "7",
        },
        "load_start": [1.0, 1.0, 1.0],
        "load_end": [1.0, 1.0, 1.0],
        "systems": {
            key: {"label": key, "package": key, "versions": {key: "1.0"}} for key in results
        },
        "results": results,
    }


@pytest.mark.system
def test_queueworks_driver_runs_every_workload(fresh_peer: PeerFactory) -> None:
    with fresh_peer() as peer:
        two = harness.throughput(peer, n=400, workers=2, budget=60)
    assert two["done"] == 400 and not two["capped"]
    assert two["jobs_per_s"] > 0 and two["enqueue_seconds"] <= two["seconds"]

    with fresh_peer() as peer:
        enq = harness.enqueue(peer, n=2000)
    assert enq["queued"] == 2000  # nothing ran: no workers
    assert enq["memory_bytes"] > 0 and enq["mb_per_100k"] > 0

    with fresh_peer() as peer:
        lat = harness.latency(peer, rate=40, count=20, workers=1)
    assert lat["jobs"] == 20
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"] < 30_000

    with fresh_peer() as peer:
        rec = harness.recovery(peer, give_up=30)
        assert peer.procs == []  # every worker group was ended
    assert rec["recovered"], rec
    assert 0 < rec["seconds"] < 30  # heartbeat TTL 3 s + one tick, whatever the load

    doc = _doc(
        {"queueworks": {"throughput_2": two, "enqueue": enq, "latency": lat, "recovery": rec}}
    )
    page = report.markdown(doc)
    assert "| **queueworks** | 1.0 |" in page
    assert f"{rec['seconds']:.1f} s" in page


@pytest.mark.unit
def test_report_flags_where_queueworks_is_behind() -> None:
    run = {"capped": False, "seconds": 1.0, "enqueue_seconds": 0.1}
    queued = {"seconds": 1.0, "bytes_per_job": 10.0}
    qw = {
        "throughput_2": {**run, "jobs_per_s": 1000.0},
        "enqueue": {**queued, "jobs_per_s": 10.0, "mb_per_100k": 1.0},
        "recovery": {"recovered": True, "seconds": 3.0},
    }
    peer = {
        "throughput_2": {**run, "jobs_per_s": 100.0},
        "enqueue": {**queued, "jobs_per_s": 50.0, "mb_per_100k": 2.0},
        "recovery": {"recovered": False, "gave_up_after_s": 180.0, "state": "stuck"},
    }
    rows = {
        (k, m): (ratio, lead)
        for k, m, ratio, lead in report.leads(_doc({"queueworks": qw, "other": peer}))
    }
    assert rows[("other", "2-worker throughput")] == ("10.0x", True)
    assert rows[("other", "enqueue rate")] == ("0.2x", False)
    assert rows[("other", "recovery time")][1] is True
    page = report.markdown(_doc({"queueworks": qw, "other": peer}))
    assert "Behind other on enqueue rate." in page
    assert "stuck" in page and "not within 180 s" in page
    tie = report.leads(_doc({"queueworks": qw, "other": qw}))[0]
    assert tie[2:] == ("1.0x", False)  # leading means strictly ahead


@pytest.mark.unit
def test_the_queue_row_is_shown_not_ranked_as_a_peer() -> None:
    run = {"capped": False, "seconds": 1.0, "enqueue_seconds": 0.5}
    lat = {"p90_ms": 1.0, "max_ms": 9.0}
    qw = {"throughput_2": {**run, "jobs_per_s": 50_000.0}}
    queue = {
        "throughput_2": {**run, "jobs_per_s": 4_000.0, "each": True},
        "latency": {**lat, "p50_ms": 0.5, "p99_ms": 2.0},
    }
    peer = {
        "throughput_2": {**run, "jobs_per_s": 5_000.0},
        "latency": {**lat, "p50_ms": 2.5, "p99_ms": 7.0},
    }
    doc = _doc({"queueworks": qw, "queueworks-queue": queue, "other": peer})
    assert {key for key, *_ in report.leads(doc)} == {"other"}  # the queue is ours
    page = report.markdown(doc)
    assert "| **queueworks-queue** | 1.0 | 4,000 |" in page
    assert "queueworks' queue, one call per job: 4,000 jobs/s on 2 workers (behind other," in page
    assert "latency p50 / p99 0.5 / 2.0 ms (the lowest p50 of this run)" in page
