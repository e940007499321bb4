"""The shared-queues benchmark (``bench/shared_queues.py``) in its quick mode: it runs its
three scenarios and prints each figure with its target and a verdict. Whether the targets
are met is the benchmark's to say, not this test's.

Budget: ~15 s when every scenario finishes; ~55 s when they run into their 10 s limits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import shared_queues

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.system
@pytest.mark.slow(55)
def test_quick_run_prints_the_three_figures(tmp_path: Path) -> None:
    out = tmp_path / "shared.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.shared_queues", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    a, b, c = (doc["results"][k] for k in "abc")
    assert a["jobs"] == 3 * doc["params"]["a_jobs"]
    assert b["subtasks"] == doc["params"]["b_subtasks"]
    assert c["one"]["queues"] == 1 and c["many"]["queues"] == doc["params"]["c_queues"]
    assert c["one"]["done"] <= c["one"]["jobs"] == c["many"]["jobs"] == doc["params"]["c_jobs"]
    figures = [line for line in proc.stdout.splitlines() if line[:4] in ("(a) ", "(b) ", "(c) ")]
    assert [line[:3] for line in figures] == ["(a)", "(b)", "(c)"], proc.stdout
    for line in figures:
        assert "[target" in line and line.endswith(("PASS", "FAIL")), line
    assert figures[0].endswith("PASS") == a["pass"]
    assert figures[2].endswith("PASS") == c["pass"]
    assert proc.stdout.rstrip().endswith("of 3 figures PASS")


def run(done: int, of: int, seconds: float, finished: bool, queues: int) -> dict[str, Any]:
    return {
        "queues": queues,
        "jobs": of,
        "done": done,
        "finished": finished,
        "seconds": seconds,
        "jobs_per_s": done / seconds,
        "ready": finished,
        "ready_wait_s": 5.0,
        "members_at_start": {"q0": 2},
    }


@pytest.mark.unit
def test_report_gives_each_figure_its_value_or_how_far_it_got() -> None:
    ready = {"ready": True, "ready_wait_s": 0.1}
    doc = {
        "params": {"limit_s": 60.0},
        "results": {
            "a": {
                **ready,
                "members_at_start": {"A": 1, "B": 1, "C": 1},
                "jobs": 300,
                "done": {"A": 100, "B": 100, "C": 100},
                "seconds": 0.5,
                "pass": True,
            },
            "b": {
                **ready,
                "members_at_start": {"busy0": 2, "busy1": 2},
                "subtasks": 200,
                "first_subtask_s": None,
                "running_s": None,
                "jobs_during_task": None,
                "busy_jobs_per_s": {"busy0": 70.0, "busy1": 71.0},
                "start_pass": False,
                "queues_pass": False,
                "pass": False,
            },
            "c": {
                "one": run(4000, 4000, 1.0, True, 1),
                "many": run(800, 4000, 60.0, False, 10),
                "ratio": None,
                "pass": False,
            },
        },
    }
    lines = shared_queues.report(doc)
    assert lines[0].endswith("all 300 done: 0.50 s  [target <= 2 s]  PASS")
    assert "submit to first subtask: did not start in 60 s  [target <= 1 s]  FAIL" in lines[2]
    assert "- (the task never ran)  [target > 0 each]  FAIL" in lines[3]
    assert lines[5].endswith("10 queues vs 1 queue: -  [target >= 0.8x]  FAIL")
    assert lines[6].startswith("    1 queue: 4,000 jobs/s in 1.00 s")
    assert lines[7].startswith("    10 queues: did not finish in 60 s (800 of 4000 done")
    assert lines[-1] == "1 of 3 figures PASS"
