"""The asyncio benchmark (``bench/asyncpeers.py``) in its tiny mode, as CI runs it:
queueworks' ``AsyncClient`` and async workers, arq, saq, streaq and the raw limit, each
through the async workload with every job counted, and the table it prints.

The peers run in their own venvs (``bench/peers/venvs.py``, pinned, from the package
registry), built on first use and reused after: a peer whose venv cannot be built fails
the test. Budget: ~15 s with the venvs built (five boots of two workers), ~1 min without.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import asyncpeers
from bench.peers import report
from tests.conftest import await_setup

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = {"queueworks-async", "arq", "saq", "streaq", "raw"}


@pytest.mark.slow(40)
@pytest.mark.system
def test_quick_run_counts_every_job_once_on_every_system(tmp_path: Path) -> None:
    await_setup("peer-venvs")  # CI builds them beside the tests (else: built here)
    out = tmp_path / "asyncpeers.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.asyncpeers", "--quick", "--results", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    p, results = doc["params"], doc["results"]
    for key in SYSTEMS:
        assert "error" not in doc["systems"][key], doc["systems"][key]
    assert set(results) == SYSTEMS
    (producers,) = p["producers"]
    name = asyncpeers.mode(producers)

    for key in SYSTEMS:
        (run,) = results[key][name]
        assert "error" not in run, (key, run)
        # every job ran, exactly once, and the system says none is left
        assert run["runs"] == {"once": p["n"], "more": 0, "never": 0}, (key, run)
        assert run["jobs"] == run["done"] == p["n"] and not run["capped"], (key, run)
        assert run["producers"] == producers and run["concurrency"] == p["concurrency"]
        assert 0 < run["enqueue_seconds"] <= run["seconds"] < p["budget_s"]
        assert run["jobs_per_s"] == run["done"] / run["seconds"]
        cpu = run["cpu_seconds"]
        assert set(cpu) == {"producer", "workers", "redis"}
        # redis-server's to the µs (it did the work); the processes' in 10 ms ticks
        assert cpu["redis"] > 0 and min(cpu.values()) >= 0, (key, cpu)

    # the table is the measured numbers, with each peer's version and the ratio to it
    page = proc.stdout
    ours = results["queueworks-async"][name][0]["jobs_per_s"]
    qw = doc["systems"]["queueworks-async"]["versions"]["queueworks"]
    assert f"| queueworks (AsyncClient, worker --concurrency) | {qw} | {ours:,.0f} |" in page
    saq = results["saq"][name][0]["jobs_per_s"]
    version = doc["systems"]["saq"]["versions"]["saq"]
    assert f"| saq | {version} | {saq:,.0f} |" in page
    assert f"| {ours / saq:,.2f}x |" in page
    assert f"≥ 5x the best of arq, saq and streaq, {producers} producer(s)" in page


@pytest.mark.unit
def test_target_is_the_median_ratio_to_each_rounds_best_peer() -> None:
    def runs(*rates: float) -> list[dict[str, float]]:
        return [{"jobs_per_s": r} for r in rates]

    doc = {
        "results": {
            "queueworks-async": {"producers_50": runs(10_000, 12_000, 9_000)},
            "arq": {"producers_50": runs(500, 500, 500)},
            "saq": {"producers_50": runs(2_000, 3_000, 1_000)},
            "streaq": {"producers_50": [{"error": "driver timed out"}, *runs(1_500, 1_800)]},
            "raw": {"producers_50": runs(50_000, 50_000, 50_000)},  # not a peer
        }
    }
    best, ratio = asyncpeers.best_peer(doc, "producers_50")
    assert best == "saq"  # median 2,000 against streaq's 1,650
    # rounds: 10,000 / 2,000 = 5; 12,000 / 3,000 = 4; 9,000 / 1,800 (streaq) = 5
    assert ratio == 5.0
    assert asyncpeers.best_peer(doc, "producers_1") == (None, None)  # not measured


@pytest.mark.unit
def test_peers_page_shows_the_asyncio_medians() -> None:
    def runs(*rates: float, capped: bool = False) -> list[dict[str, Any]]:
        return [{"jobs_per_s": r, "capped": capped} for r in rates]

    adoc = {
        "date": "2026-12-01 12:00 UTC",
        "command": "python -m bench.asyncpeers",
        "params": {"n": 20_000, "workers": 2, "concurrency": 50, "producers": [50, 1]}
        | {"repeat": 3, "budget_s": 15.0},
        "systems": {
            "queueworks-async": {"label": "qw", "package": "queueworks", "versions": {}},
            "arq": {"label": "arq", "package": "arq", "versions": {"arq": "0.28.0"}},
        },
        "results": {
            "queueworks-async": {
                "producers_50": runs(9_000, 20_000, 10_000),
                "producers_1": [{"error": "driver timed out"}],
            },
            "arq": {"producers_50": runs(500, 600, 700, capped=True), "producers_1": runs(4)},
        },
    }
    page = "\n".join(report._asyncio(adoc))
    assert "| system | version | P = 50 | P = 1 |" in page
    assert "| qw |  | 10,000 | failed |" in page  # medians; a failed run says so
    assert "| arq | 0.28.0 | 600* | 4 |" in page  # * = stopped at the budget
    assert report._asyncio(None) == []  # no asyncio run: no section
