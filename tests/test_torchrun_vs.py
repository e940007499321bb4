"""Issue 21: ``bench.torchrun_vs --smoke`` — queueworks step mode and torchrun, each through
2 nodes -> add 2 -> SIGKILL 1 -> remove 1, with real processes. One test per system, each
running the benchmark for its system alone (``--systems``): the two run at the same time on
two xdist workers. Budget: ~45 s (queueworks) and ~70 s (torchrun) alone, about 60 s and
115 s inside the suite."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, TORCH_INSTALL, need_packages

pytestmark = [pytest.mark.timeout(600)]

need_packages("torch", "numpy", install=TORCH_INSTALL)  # skipped for a user, a failure in CI


def is_subsequence(wanted: list[int], seen: list[int]) -> bool:
    it = iter(seen)
    return all(any(x == w for x in it) for w in wanted)


@pytest.mark.unit
def test_the_steady_rows_set_the_systems_side_by_side() -> None:
    from bench.torchrun_vs import steady_table

    def run(system: str, ms: float, rate: float) -> dict[str, Any]:
        return {"system": system, "error": None, "step_ms": {2: ms}, "samples_per_s_at": rate}

    result = {
        "static": 2,
        "systems": [
            run("queueworks", 34.0, 1800.0),
            run("torchrun", 32.0, 2000.0),
            run("queueworks", 36.0, 1700.0),
            run("torchrun", 40.0, 1900.0),
            run("queueworks", 35.0, 1750.0),
            run("torchrun", 33.0, 1950.0),
            {"system": "torchrun", "error": "failed"},  # a failed run counts nothing
        ],
    }
    rows = steady_table(result).splitlines()
    assert rows[0] == "| median of 3 run(s) | queueworks | torchrun | queueworks ÷ torchrun |"
    assert rows[2] == "| steady step at 2 nodes (ms) | 35.0 | 33.0 | 1.06 |"
    assert rows[3] == "| samples/s at 2 nodes, no failure | 1750 | 1950 | 0.90 |"


@pytest.mark.unit
def test_rounds_of_joins_report_their_median_and_their_worst() -> None:
    """``--rounds``: every round's "add 2" counts; one that never reached its size is the
    worst (infinite), a leave is not a join."""
    from bench.torchrun_vs import rounds, steady_table

    changes = rounds(3)
    assert [c.what for c in changes][:2] == ["add 2 (round 1)", "remove 2 (round 1)"]
    assert [c.size for c in changes] == [4, 2] * 3
    assert [c.at for c in changes] == sorted(c.at for c in changes) and changes[-1].at < 1

    def run(system: str, joins: list[float | None]) -> dict[str, Any]:
        added = [{"what": f"add 2 (round {i})", "to_new_size": t} for i, t in enumerate(joins)]
        left = [{"what": "remove 2 (round 1)", "to_new_size": 9.0}]
        return {"system": system, "error": None, "step_ms": {2: 33.0}, "samples_per_s": 1.0,
                "changes": added + left}  # fmt: skip

    result = {
        "static": 0,
        "systems": [run("queueworks", [2.0, 2.5, 2.2]), run("torchrun", [7.0, None, 6.0])],
    }
    rows = steady_table(result).splitlines()
    assert rows[4] == "| 2 joining at once: to new size (s), median of 3 | 2.20 | 7.00 | 0.31 |"
    assert rows[5] == "| 2 joining at once: to new size (s), worst | 2.50 | inf | 0.00 |"


def smoke_run(system: str, tmp_path: Path, *more: str) -> dict[str, Any]:
    """The smoke scenario for one system (with ``more`` arguments): its run's figures,
    with the one-process loss (``reference``) beside them."""
    out = tmp_path / "result.json"
    argv = ["-m", "bench.torchrun_vs", "--smoke", "--systems", system, "--json", str(out), *more]
    proc = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"| {system} |" in proc.stdout, proc.stdout
    data: dict[str, Any] = json.loads(out.read_text())
    (profile,) = data["profiles"]
    (run,) = profile["systems"]
    assert run["system"] == system
    check_whole_scenario(run, profile["reference"])
    return run


def check_whole_scenario(run: dict[str, Any], reference: float) -> None:
    """What both systems must show: every change reached, nothing lost or applied twice."""
    name = run["system"]
    assert run["error"] is None, (name, run["error"])
    # the steps ran at 2, 4, 3, 2 (maybe at 1 first, at 3 on the way to 4)
    assert is_subsequence([2, 4, 3, 2], run["sizes_stepped"]), (name, run)
    assert run["sizes_stepped"][-1] == run["sizes"][-1] == 2, (name, run)
    assert [c["size"] for c in run["changes"]] == [4, 3, 2]
    for c in run["changes"]:
        assert c["to_new_size"] is not None, (name, c)
        assert 0 < c["to_new_size"] < 90, (name, c)
        assert 0 < c["paused"] <= c["to_new_size"] + 0.5, (name, c)
        assert c["sizes_seen"][-1] == c["size"], (name, c)
    # every sample in exactly one update of the final model
    assert (run["lost_samples"], run["twice_samples"]) == (0, 0), (name, run)
    assert 0 < run["wall"] < 240 and 0 < run["startup"] < 60, (name, run)
    assert run["samples_per_s"] > 0
    # the logs account for the model: replaying them gives the final model's loss
    assert math.isfinite(run["final_loss"])
    assert abs(run["final_loss"] - run["replay_loss"]) < 1e-3, (name, run)
    assert abs(run["final_loss"] - reference) < 0.2 * reference, (name, run, reference)
    assert run["overlapping_generations"] == 0, (name, run)


@pytest.mark.system
@pytest.mark.slow(45)
def test_queueworks_runs_the_scenario_and_repeats_nothing(tmp_path: Path) -> None:
    qw = smoke_run("queueworks", tmp_path)
    assert qw["repeated_samples"] == 0
    assert all(c["repeated_steps"] == 0 for c in qw["changes"])
    assert qw["aborted_steps"] <= 4, qw  # a kill or a leave aborts the step in flight
    # a graceful leave needs no failure detection in queueworks: the step at the new size
    # comes before the heartbeat TTL (3 s) could have told anyone (about 1 s; 2.01 s once
    # on a loaded machine, so the bound is the TTL itself)
    remove = qw["changes"][2]
    assert remove["what"].startswith("remove") and remove["to_new_size"] < 3.0, remove


@pytest.mark.system
@pytest.mark.slow(100)
def test_torchrun_runs_the_scenario_and_redoes_steps(tmp_path: Path) -> None:
    # half the shards, each paced 2.5x longer: about the smoke run's length (its changes
    # wait on process starts, 10-15 s each under load), in half the steps, each of which
    # costs every rank CPU; what is checked here is how torchrun restarts, not its speed
    tr = smoke_run("torchrun", tmp_path, "--shards", "1200", "--pace", "0.05")
    # torchrun restarts its workers on every change (a new generation each time), from its
    # snapshot: the steps since it are redone. Each change is made halfway between two
    # snapshots, but the restart comes seconds later, when the round forms, so one of them
    # may land just after a snapshot and redo nothing; all three cannot (about 1 in 8,000).
    assert tr["generations"] >= 1 + len(tr["changes"]), tr
    assert sum(c["repeated_steps"] for c in tr["changes"]) >= 1, tr["changes"]
