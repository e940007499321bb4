"""The queue benchmark (``bench/queue.py``) in its tiny mode: queueworks' queue and the raw
limit through the one-call-per-job, latency and enqueue_many workloads, as CI runs it, and
the tables it prints from what it measured.

No venvs are built here (the peers run only in a full ``python -m bench.queue``).
Budget: ~10 s (two boots of a controller and two workers, one of one worker).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import queue as bench_queue

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.system
def test_quick_run_measures_queue_and_raw_limit(tmp_path: Path) -> None:
    out = tmp_path / "queue.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.queue", "--quick", "--results", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    results, p = doc["results"], doc["params"]
    assert set(results) == {"queueworks-queue", "raw"}

    for key in ("queueworks-queue", "raw"):
        (run,) = results[key]["throughput"]
        assert "error" not in run, run
        assert run["each"] and run["workers"] == 2
        assert run["done"] == run["jobs"] == p["each_n"] and not run["capped"]
        assert 0 < run["enqueue_seconds"] <= run["seconds"]
        assert run["jobs_per_s"] == run["done"] / run["seconds"]

        (lat,) = results[key]["latency"]
        assert "error" not in lat, lat
        assert lat["jobs"] == p["latency_count"]
        assert 0 < lat["p50_ms"] <= lat["p90_ms"] <= lat["p99_ms"] <= lat["max_ms"] < 5_000

    (many,) = results["queueworks-queue"]["enqueue"]
    assert many["queued"] == many["jobs"] == p["many_n"]  # no workers: all still queued
    assert many["jobs_per_s"] > 0 and many["bytes_per_job"] > 0

    # the printed tables are the measured numbers, and the targets it could check
    page = proc.stdout
    ours = results["queueworks-queue"]["throughput"][0]["jobs_per_s"]
    assert f"| queueworks queue, one call per job | {ours:,.0f} |" in page
    ratio = ours / results["raw"]["throughput"][0]["jobs_per_s"]
    assert f"| one call per job >= 0.7x the raw limit | {ratio:.2f}x |" in page
    assert "| one call per job >= 10x RQ SimpleWorker | - | - |" in page  # RQ not run


@pytest.mark.unit
def test_targets_compare_rounds_side_by_side() -> None:
    def runs(*rates: float) -> list[dict[str, float]]:
        return [{"jobs_per_s": r, "p50_ms": 100 / r, "p99_ms": 400 / r} for r in rates]

    doc = {
        "systems": {k: {"label": k} for k in ("queueworks-queue", "raw", "rq-simple", "arq")},
        "results": {
            "queueworks-queue": {"throughput": runs(9000, 3000, 6000), "latency": runs(10)},
            "raw": {"throughput": runs(10000, 5000, 8000)},
            "rq-simple": {"throughput": runs(600, 250, 500), "latency": runs(2)},
            "arq": {"throughput": [{"error": "driver timed out"}, *runs(100, 100)]},
        },
    }
    met = {text: (value, ok) for text, value, ok in bench_queue.targets(doc)}
    # per-round ratios 0.9, 0.6, 0.75: median 0.75 (the ratio of medians would be 0.75 too)
    assert met["one call per job >= 0.7x the raw limit"] == ("0.75x", True)
    assert met["one call per job >= 10x RQ SimpleWorker"] == ("12.00x", True)  # 15, 12, 12
    # a failed round is left out of the pairs, not counted as zero
    assert met["one call per job ahead of arq"] == ("45.00x", True)  # rounds 2, 3: 30, 60
    assert met["latency p50 <= 0.5x RQ SimpleWorker's"] == ("0.20x", True)
    assert met["enqueue_many >= 100,000 jobs/s"] == ("-", None)  # not measured
