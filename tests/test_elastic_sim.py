"""Elastic vs static (bench/elastic_sim.py): the measured claim, then the simulator itself.

No Redis here: the simulation drives the controller's pure allocator. Budget: ~3 s.
"""

import math
import statistics
from collections import defaultdict

import pytest

from bench.elastic_sim import (
    HIGH_PRIORITY,
    POLICIES,
    PoolEvent,
    Run,
    Trace,
    TraceParams,
    TraceTask,
    beats,
    compare,
    main,
    make_trace,
    metrics,
    simulate,
)

pytestmark = pytest.mark.unit

SEEDS = (1, 2, 3, 4, 5)  # the published run: python -m bench.elastic_sim


def hand_trace(tasks: list[TraceTask], workers: int, pool: tuple[PoolEvent, ...] = ()) -> Trace:
    return Trace(TraceParams(), tuple(tasks), tuple(f"w{i:04d}" for i in range(workers)), pool)


# --- the claim ---------------------------------------------------------------------------------


def test_elastic_beats_static_on_all_three_metrics() -> None:
    results = [compare(TraceParams(seed=s)) for s in SEEDS]
    for seed, r in zip(SEEDS, results, strict=True):
        elastic, static = r["elastic"], r["static"]
        assert beats(elastic, static), (seed, elastic, static)
        assert elastic.backlog_utilization > static.backlog_utilization
    mean = {
        name: {
            key: statistics.fmean(getattr(r[name], key) for r in results)
            for key in ("mean_completion", "high_wait", "utilization")
        }
        for name in POLICIES
    }
    for rival in ("static", "static-backfill"):  # on the mean over the seeds, both baselines
        assert mean["elastic"]["mean_completion"] < mean[rival]["mean_completion"]
        assert mean["elastic"]["high_wait"] < mean[rival]["high_wait"]
        assert mean["elastic"]["utilization"] > mean[rival]["utilization"]


# --- the simulator -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", POLICIES)
def test_work_is_conserved_and_node_sets_stay_legal(name: str) -> None:
    trace = make_trace(TraceParams(seed=3))
    run = simulate(trace, name)
    specs = {t.id: t for t in trace.tasks}
    assert set(run.tasks) == set(specs)
    for t in run.tasks.values():
        assert t.done is not None and t.started is not None
        assert t.spec.arrival <= t.started < t.done <= run.makespan

    # Work conservation: node-seconds of progress, summed from the segments, equal the work.
    done: dict[str, float] = defaultdict(float)
    for s in run.segments:
        done[s.task] += len(s.nodes) * s.productive
    for tid, spec in specs.items():
        assert done[tid] == pytest.approx(spec.work, rel=1e-9)
    total = sum(spec.work for spec in specs.values())
    assert sum(done.values()) == pytest.approx(total, rel=1e-9)
    assert run.work_done == pytest.approx(total, rel=1e-9)

    # Sizes: progress only with min <= n <= max; elastic holds 0 or a legal gang; static <= min.
    for s in run.segments:
        spec, n = specs[s.task], len(s.nodes)
        assert 0 <= s.productive <= s.end - s.start
        if s.productive > 0:
            assert spec.min_nodes <= n <= spec.max_nodes, s
        if name == "elastic":
            assert spec.min_nodes <= n <= spec.max_nodes, s
        else:
            assert n <= spec.min_nodes, s

    # Nodes: live workers only, never two tasks at once.
    live = {(a, b): ws for a, b, ws in run.pool_log}
    per_interval: dict[tuple[float, float], list[frozenset[str]]] = defaultdict(list)
    for s in run.segments:
        per_interval[(s.start, s.end)].append(s.nodes)
    for interval, sets in per_interval.items():
        union = frozenset().union(*sets)
        assert len(union) == sum(map(len, sets)), interval
        assert union <= live[interval], interval

    # Accounting of the pool: utilization is a fraction, held covers the progress.
    assert run.available == pytest.approx(sum((b - a) * len(ws) for a, b, ws in run.pool_log))
    assert run.work_done <= run.held + 1e-6 <= run.available + 1e-6
    if name != "elastic":
        assert run.preemptions == 0


def test_one_task_grows_to_max_under_elastic_and_keeps_min_under_static() -> None:
    trace = hand_trace([TraceTask("t", 5.0, 100.0, 1, 4, 0)], workers=4)
    for pause in (0.0, 0.5):
        elastic, static = simulate(trace, "elastic", pause), simulate(trace, "static", pause)
        assert elastic.tasks["t"].done == pytest.approx(5 + pause + 100 / 4)
        assert static.tasks["t"].done == pytest.approx(5 + pause + 100)
        assert elastic.changes == static.changes == 1
        assert metrics(elastic).utilization == pytest.approx(100 / (4 * (5 + pause + 25)))


def test_high_priority_preempts_under_elastic_and_waits_under_static() -> None:
    trace = hand_trace(
        [
            TraceTask("low", 0.0, 1000.0, 1, 2, 0),
            TraceTask("high", 10.0, 20.0, 2, 2, HIGH_PRIORITY),
        ],
        workers=2,
    )
    elastic = simulate(trace, "elastic", pause=0.2)
    # low runs on 2 nodes; high takes both at once (surplus, then the whole low task); low
    # gets them back when high is done and keeps the progress it had made.
    assert elastic.tasks["high"].started == 10.0
    assert elastic.tasks["high"].done == pytest.approx(10.2 + 20 / 2)
    assert elastic.tasks["low"].done == pytest.approx(20.4 + (1000 - 2 * 9.8) / 2)
    assert elastic.preemptions == 1
    assert metrics(elastic).high_wait == 0.0

    static = simulate(trace, "static", pause=0.2)
    # low holds its one node to the end; high needs two and waits.
    assert static.tasks["low"].done == pytest.approx(0.2 + 1000)
    assert static.tasks["high"].started == pytest.approx(1000.2)
    assert metrics(static).high_wait == pytest.approx(990.2)


def test_a_lost_node_shrinks_elastic_and_stalls_static_until_a_replacement() -> None:
    pool = (PoolEvent(5.0, "w0000", False), PoolEvent(15.0, "w0002", True))
    trace = hand_trace([TraceTask("t", 0.0, 40.0, 1, 2, 0)], workers=2, pool=pool)
    # elastic: 2 nodes (pause, 4.5 s), 1 node (pause, 9.5 s), 2 nodes again for the rest.
    elastic = simulate(trace, "elastic", pause=0.5)
    assert elastic.tasks["t"].done == pytest.approx(15.5 + (40 - 9 - 9.5) / 2)
    assert elastic.changes == 3
    # static: one node, w0000; it leaves and the free w0001 replaces it in the same instant.
    static = simulate(trace, "static", pause=0.5)
    assert static.tasks["t"].done == pytest.approx(5.5 + (40 - 4.5))
    assert static.changes == 2

    # With no spare node the static task holds nothing, waits for the join, keeps its progress.
    lone = hand_trace(
        [TraceTask("t", 0.0, 40.0, 1, 1, 0)],
        workers=1,
        pool=(PoolEvent(5.0, "w0000", False), PoolEvent(15.0, "w0001", True)),
    )
    for name in POLICIES:
        run = simulate(lone, name, pause=0.0)
        assert run.tasks["t"].done == pytest.approx(50.0)
        assert run.work_done == pytest.approx(40.0)
        assert metrics(run).utilization == pytest.approx(40.0 / 40.0)  # 10 s with no live node


def test_a_task_that_can_never_start_is_reported() -> None:
    trace = hand_trace([TraceTask("t", 0.0, 10.0, 2, 2, 0)], workers=1)
    with pytest.raises(RuntimeError, match="wait forever"):
        simulate(trace, "elastic")


def test_the_trace_is_deterministic_and_follows_its_parameters() -> None:
    params = TraceParams(seed=11)
    assert make_trace(params) == make_trace(params)
    assert make_trace(params) != make_trace(TraceParams(seed=12))
    a, b = simulate(make_trace(params), "elastic"), simulate(make_trace(params), "elastic")
    assert _times(a) == _times(b)

    loads, highs = [], []
    for seed in SEEDS:
        trace = make_trace(TraceParams(seed=seed))
        assert len(trace.tasks) == 200
        size = len(trace.workers)
        for ev in trace.pool:
            size += 1 if ev.joins else -1
            assert 4 <= size <= 12
        for t in trace.tasks:
            assert t.min_nodes in (1, 2, 4) and t.min_nodes <= t.max_nodes <= 8
        loads.append(sum(t.work for t in trace.tasks) / (trace.tasks[-1].arrival * 8))
        highs.append(sum(t.priority == HIGH_PRIORITY for t in trace.tasks) / 200)
    assert statistics.fmean(loads) == pytest.approx(0.8, rel=0.25)
    assert statistics.fmean(highs) == pytest.approx(0.2, rel=0.25)


def test_cli_prints_the_table_and_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tasks", "40", "--seeds", "2", "--per-seed"]) == 0
    out = capsys.readouterr().out
    assert "seeds 1, 2; pause per node-set change 0.2 s" in out
    assert "  tasks = 40" in out
    for name in POLICIES:
        assert f"| {name} |" in out
    assert "elastic better than static, seeds won:" in out


def _times(run: Run) -> list[tuple[str, float, float]]:
    return sorted((tid, t.started or math.nan, t.done or math.nan) for tid, t in run.tasks.items())
