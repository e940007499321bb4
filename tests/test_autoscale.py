"""Autoscaling: the wanted-workers count (``controller.wanted``), the autoscaler's
hysteresis and command (``queueworks.contrib.autoscaler``), and the whole loop with real processes:
a controller, ``queueworks autoscale`` and a stand-in scale command that starts and stops
local workers (``tests/scale_workers.py``) -- from zero, a backlog brings a worker, a task
with ``min_nodes=3`` brings three, idleness takes them back to zero through graceful leaves,
and nothing is lost."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from queueworks import Client, TaskSpec, TaskState
from queueworks.cli import main as cli
from queueworks.cli.info import wanted_line
from queueworks.contrib.autoscaler import Hysteresis, command_for, program_of, run_command
from queueworks.controller.wanted import Need, wanted, workers_for
from queueworks.protocol import wanted as published
from queueworks.protocol.keys import Keys
from tests.conftest import ROOT, Cluster, wait_for
from tests.scale_workers import alive

# -- the count: pure --------------------------------------------------------------------------


def need(**kw: Any) -> Need:
    base: dict[str, Any] = {
        "id": "t",
        "selector": "",
        "queue": True,
        "min_nodes": 1,
        "max_nodes": None,
        "work": 10,
    }
    return Need(**{**base, **kw})


@pytest.mark.unit
def test_an_idle_queue_or_finished_task_wants_nothing() -> None:
    assert workers_for(need(work=0, min_nodes=3), 60) == 0
    assert workers_for(need(queue=False, work=0, min_nodes=3), 60) == 0
    assert wanted([need(work=0), need(id="u", queue=False, work=0)], 60) == {"": 0}
    assert wanted([], 60) == {}


@pytest.mark.unit
def test_work_wants_its_floor_then_what_drains_it_within_the_target() -> None:
    assert workers_for(need(work=1000), 60) == 1  # the rate is not known yet: the floor
    assert workers_for(need(work=1000, min_nodes=2), 60) == 2
    # 1,200 jobs at 2 a second per worker in 60 s: 10 workers, bounded by max_nodes
    assert workers_for(need(work=1200, per_worker=2.0), 60) == 10
    assert workers_for(need(work=1200, per_worker=2.0, max_nodes=4), 60) == 4
    assert workers_for(need(work=3, per_worker=0.001), 60) == 3  # never more than the work
    task = need(queue=False, work=None, min_nodes=3, max_nodes=8)
    assert workers_for(task, 60) == 3  # a task without a count: its gang
    assert workers_for(need(queue=False, work=500, per_worker=1.0, partitions=2), 60) == 2


@pytest.mark.unit
def test_tasks_add_up_queues_share_and_selectors_count_apart() -> None:
    needs = [
        need(id="a", queue=False, min_nodes=3, work=100),
        need(id="b", queue=False, min_nodes=2, work=100),
        need(id="q1", work=5),  # 1 each, but one worker serves both queues
        need(id="q2", work=5),
        need(id="g", queue=False, selector="gpu=yes", min_nodes=1, work=9),
        need(id="q3", selector="gpu=yes", work=0),
    ]
    # q3 is idle but guards a member from g, of its priority: g's 1 and q3's 1
    assert wanted(needs, 60) == {"": 3 + 2 + 1, "gpu=yes": 1 + 1}
    # an idle queue guards its min_nodes from the tasks of its priority or lower
    gang = need(id="t", queue=False, min_nodes=3, work=30)
    assert wanted([gang, need(id="q", work=0, min_nodes=2)], 60) == {"": 5}
    assert wanted([gang, need(id="q", work=0, min_nodes=2, priority=-1)], 60) == {"": 3}
    fractions = [need(id=f"q{i}", work=10, per_worker=10 / 60 / 0.4) for i in range(5)]
    assert wanted(fractions, 60) == {"": 2}  # 5 x 0.4 of a worker: 2 workers


@pytest.mark.unit
def test_selector_names_and_bad_selectors() -> None:
    assert published.selector_name({"b": "2", "a": "1"}) == "a=1,b=2"
    assert published.parse_selector(["b=2", "a=1"]) == "a=1,b=2"
    assert published.parse_selector(["a=1,b=2"]) == "a=1,b=2"
    assert published.parse_selector([]) == ""
    for bad in (["gpu"], ["a=b=c"], ["a=1", "a=2"], ["=1"], ["a b=1"]):
        with pytest.raises(ValueError, match="selector"):
            published.parse_selector(bad)
    assert published.decode(b"not json") is None and published.decode(None) is None
    value = published.Wanted(at=1.0, by="c", target_s=60, selectors={"": 2})
    assert published.decode(published.encode(value)) == value and value.of("x=1") == 0
    assert wanted_line(None, 0).startswith("wanted workers: none published")
    assert "(any)=2" in wanted_line(value, 3.0)


# -- the decision: pure -----------------------------------------------------------------------


@pytest.mark.unit
def test_hysteresis_up_at_once_down_after_the_cooldown_within_bounds() -> None:
    h = Hysteresis(minimum=0, maximum=5, cooldown=10)
    assert h.decide(None, 0) is None  # nothing published: hold
    assert h.decide(0, 0) == 0  # what runs is unknown: set it
    h.running = 0
    assert h.decide(3, 1) == 3  # up at once
    h.running = 3
    assert h.decide(9, 2) == 5  # bounded by --max
    h.running = 5
    for t in range(3, 12):
        assert h.decide(1, t) is None, t  # the 5 of t=2 is in the window until t=12
    assert h.decide(1, 12.5) == 1
    h.running = 1
    assert h.decide(0, 13) is None  # the window still holds 1s
    assert h.decide(0, 22.6) == 0  # scale to zero
    floor = Hysteresis(minimum=2, maximum=5, cooldown=0)
    assert floor.decide(0, 0) == 2


@pytest.mark.unit
def test_hysteresis_never_flaps_on_a_wanted_count_that_swings() -> None:
    h = Hysteresis(minimum=0, maximum=10, cooldown=5)
    changes = []
    for step in range(200):  # a count that swings between 2 and 6 every second
        t = step * 0.5
        n = h.decide(6 if int(t) % 2 else 2, t)
        if n is not None:
            changes.append((t, n))
            h.running = n
    assert [n for _, n in changes] == [2, 6], changes  # up once; never down while it swings


@pytest.mark.unit
def test_bad_bounds_and_commands_are_refused_by_name() -> None:
    for lo, hi, cool, word in ((-1, 3, 1, "--min"), (3, 2, 1, "--max"), (0, 3, -1, "--cooldown")):
        with pytest.raises(ValueError, match=word):
            Hysteresis(lo, hi, cool)
    with pytest.raises(ValueError, match=r"\{n\}"):
        command_for("docker compose up --scale worker=3", shell=False)
    with pytest.raises(ValueError, match="split"):
        command_for("echo 'unclosed {n}", shell=False)
    argv = command_for("kubectl scale 'deployment/my worker' --replicas={n}", shell=False)
    assert argv(4) == ["kubectl", "scale", "deployment/my worker", "--replicas=4"]
    assert command_for("echo {n} | cat", shell=True)(2) == "echo 2 | cat"
    assert program_of(["/usr/bin/docker", "--password", "s3cret"]) == "docker"


@pytest.mark.unit
def test_a_command_that_cannot_run_is_reported_not_raised() -> None:
    assert run_command(["/nonexistent/scale-command", "1"], 5) == "not_found"


# -- the whole loop, with processes -----------------------------------------------------------

GATE_WITHIN = 120.0


@pytest.fixture
def scaled(tmp_path: Path) -> Iterator[Path]:
    """The stand-in's state folder; every worker it started is killed at the end (by its
    pid, which the stand-in wrote)."""
    state = tmp_path / "scaled"
    state.mkdir()
    yield state
    for f in state.rglob("*.pid"):
        pid = int(f.read_text())
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def live_workers(state: Path) -> int:
    return sum(alive(int(f.read_text())) for f in state.glob("*.pid"))


def causes(r: redis.Redis, keys: Keys, task_id: str) -> list[tuple[str, str]]:
    raw: Any = r.xrange(keys.task(task_id).history)
    return [(f[b"cause"].decode(), f.get(b"worker", b"").decode()) for _, f in raw]


@pytest.mark.system
@pytest.mark.slow(40)
def test_autoscale_from_zero_to_a_backlog_a_gang_and_back_to_zero(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, scaled: Path
) -> None:
    cluster.controller()
    command = f"{sys.executable} tests/scale_workers.py --state {scaled} {{n}}"
    scaler = cluster.spawn(
        ["autoscale", "--scale-command", command, "--min", "0", "--max", "4", "--cooldown", "3"],
        "autoscale",
    )
    calls = scaled / "calls"
    wait_for(lambda: calls.exists() and calls.read_text().split() == ["0"], 30, "a first 0")
    assert live_workers(scaled) == 0

    # from zero: a backlog brings a worker (counted within a pass, started by the scaler: ~2 s
    # on a quiet machine, the figure below; a Python process's start-up alone took 4 s in a
    # loaded suite), and its jobs run
    q = client.queue("mail")
    t0 = time.monotonic()
    jobs = q.enqueue_many(("tests.handlers:double", {"x": i}) for i in range(50))
    wait_for(lambda: r.zcard(keys.workers) >= 1, 15, "a worker for the backlog, registered")
    started_s = time.monotonic() - t0
    assert [j.result(timeout=60) for j in jobs] == [2 * i for i in range(50)]

    # a task with min_nodes=3 brings three (it holds at its gate until they are there)
    gate = f"{keys.prefix}:gate"
    subtasks = [{"x": i, "gate": gate, "within": GATE_WITHIN} for i in range(30)]
    spec = TaskSpec(
        name="gang", handler="tests.handlers:double_at_gate", subtasks=subtasks, min_nodes=3
    )
    task = client.submit(spec)
    wait_for(lambda: len(task.status().nodes) == 3, 60, "the task's 3 nodes")
    wanted_now = published.read(r, keys)
    assert wanted_now is not None and wanted_now.of("") >= 3, wanted_now
    r.set(gate, 1)
    status = task.wait(timeout=120)
    assert (status.state, status.done, status.dead) == (TaskState.COMPLETED, 30, 0), status

    # idle: back to zero, by graceful leaves only
    wait_for(lambda: live_workers(scaled) == 0, 60, "every worker gone", interval=0.1)
    wait_for(lambda: r.zcard(keys.workers) == 0, 10, "the pool empty")
    for tid in ("mail", task.id):
        seen = causes(r, keys, tid)
        assert {c for c, _ in seen} <= {"join", "leave", "rebalanced"}, (tid, seen)
        joined = {w for c, w in seen if c == "join"}
        assert joined and joined <= {w for c, w in seen if c == "leave"}, (tid, seen)
    assert q.status().done == 50 and q.status().dead == 0
    sizes = [int(n) for n in calls.read_text().split()]
    assert sizes[0] == 0 and sizes[-1] == 0 and max(sizes) >= 3, sizes
    assert all(a != b for a, b in itertools.pairwise(sizes)), sizes  # no repeats
    assert scaler.alive()
    assert scaler.terminate(10) == 0
    log = scaler.log()
    assert "scale_failed" not in log and "tests/scale_workers.py" not in log
    print(f"FIGURE autoscale_backlog_to_worker_s={started_s:.2f} sizes={sizes}")


@pytest.mark.system
def test_a_selector_scales_only_the_workers_that_match_it(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, scaled: Path
) -> None:
    """Two scalers, one per selector, as two compose services or two deployments would
    be: a task for ``gpu=yes`` workers brings labelled workers through its own scaler, the
    scaler of unlabelled workers stays at zero, and both end at zero."""
    cluster.controller()
    calls = {}
    for sel, labels in (("gpu=yes", "--label gpu=yes "), ("", "")):
        state = scaled / (sel or "plain")
        command = f"{sys.executable} tests/scale_workers.py --state {state} {labels}{{n}}"
        args = ["autoscale", "--scale-command", command, "--max", "3", "--cooldown", "2"]
        cluster.spawn([*args, *(["--selector", sel] if sel else [])], f"as-{sel or 'plain'}")
        calls[sel] = state / "calls"
    for f in calls.values():
        wait_for(lambda f=f: f.exists() and f.read_text().split() == ["0"], 30, "a first 0")

    gate = f"{keys.prefix}:gate"
    spec = TaskSpec(
        name="on-gpu",
        handler="tests.handlers:double_at_gate",
        subtasks=[{"x": i, "gate": gate, "within": GATE_WITHIN} for i in range(20)],
        min_nodes=2,
        node_selector={"gpu": "yes"},
    )
    task = client.submit(spec)
    wait_for(lambda: len(task.status().nodes) == 2, 60, "the task's 2 labelled nodes")
    wanted_now = published.read(r, keys)
    assert wanted_now is not None and wanted_now.of("gpu=yes") >= 2, wanted_now
    r.set(gate, 1)
    status = task.wait(timeout=90)
    assert (status.state, status.done, status.dead) == (TaskState.COMPLETED, 20, 0), status
    wait_for(lambda: live_workers(scaled / "gpu=yes") == 0, 60, "the gpu workers gone", 0.1)
    gpu = [int(n) for n in calls["gpu=yes"].read_text().split()]
    assert gpu[0] == 0 and max(gpu) >= 2 and gpu[-1] == 0, gpu
    assert calls[""].read_text().split() == ["0"]  # never asked for an unlabelled worker
    seen = causes(r, keys, task.id)
    assert {c for c, _ in seen} <= {"join", "leave", "rebalanced"}, seen


@pytest.mark.system
def test_a_failing_scale_command_is_retried_with_backoff_not_looped(
    cluster: Cluster, r: redis.Redis, keys: Keys, tmp_path: Path
) -> None:
    marks = tmp_path / "tries"
    value = published.Wanted(at=time.time(), by="test", target_s=60, selectors={"": 2})
    r.set(keys.wanted, published.encode(value), px=60_000)
    secret = "hunter2-not-for-logs"
    command = f"sh -c 'echo {{n}} >> {marks}; exit 3' --token={secret}"
    scaler = cluster.spawn(
        ["autoscale", "--scale-command", command, "--max", "5", "--interval", "0.05"],
        "autoscale",
    )
    wait_for(lambda: marks.exists() and len(marks.read_text().split()) >= 3, 20, "3 tries")
    tries = marks.read_text().split()
    assert set(tries) == {"2"}
    time.sleep(1.5)  # the backoff is 1, 2, 4 s: at most one more try in that time
    assert len(marks.read_text().split()) <= len(tries) + 1
    assert scaler.terminate(10) == 0
    log = scaler.log()
    failures = [json.loads(line) for line in log.splitlines() if '"scale_failed"' in line]
    assert failures and {f["exit_code"] for f in failures} == {3}
    assert [f["retry_in"] for f in failures[:3]] == [1.0, 2.0, 4.0]
    assert secret not in log


@pytest.mark.system
def test_a_stop_does_not_wait_for_a_scale_command_under_way(
    cluster: Cluster, r: redis.Redis, keys: Keys, tmp_path: Path
) -> None:
    """SIGTERM while the scale command runs (a ``docker compose up`` that waits on the engine):
    the command gets SIGTERM and the scaler exits 0 at once, well within a container's grace
    period, not when the command is done."""
    value = published.Wanted(at=time.time(), by="test", target_s=60, selectors={"": 2})
    r.set(keys.wanted, published.encode(value), px=60_000)
    pid_file = tmp_path / "command.pid"
    command = f"sh -c 'echo $$ > {pid_file}; exec sleep 120' scale {{n}}"
    scaler = cluster.spawn(["autoscale", "--scale-command", command, "--max", "5"], "autoscale")
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 30, "the command")
    pid = int(pid_file.read_text())
    assert alive(pid)
    t = time.monotonic()
    assert scaler.terminate(60) == 0
    took = time.monotonic() - t
    assert took < 30, took  # (a second or so alone; 7 s in a loaded suite; the command: 120 s)
    wait_for(lambda: not alive(pid), 5, "the command gone")
    events = [json.loads(line) for line in scaler.log().splitlines() if line.startswith("{")]
    stopped = [e for e in events if e["event"] == "scale_stopped"]
    assert [e["to"] for e in stopped] == [2], events


@pytest.mark.system
def test_autoscale_refuses_bad_input_by_name() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["autoscale", "--scale-command", "echo 1", "--max", "2"])
    assert res.exit_code == 2 and "{n}" in res.output
    res = runner.invoke(cli, ["autoscale", "--scale-command", "echo {n}", "--max", "2",
                              "--min", "3"])  # fmt: skip
    assert res.exit_code == 2 and "--max" in res.output
    res = runner.invoke(
        cli, ["autoscale", "--scale-command", "echo {n}", "--max", "2", "--selector", "gpu"]
    )
    assert res.exit_code == 2 and "selector" in res.output
    assert (ROOT / "tests" / "scale_workers.py").exists()


# -- where it shows: /metrics, the JSON API, info ---------------------------------------------


@pytest.mark.integration
def test_the_dashboard_and_info_show_the_published_count(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    from queueworks.cli.info import render
    from tests.test_dashboard import make_app

    with make_app(client) as web:
        none = web.get("/api/autoscale").json()
        assert none == {
            "selector": "",
            "published": False,
            "wanted": 0,
            "selectors": {},
            "at": None,
            "by": None,
        }
        assert 'queueworks_workers_wanted{selector=""}' not in web.get("/metrics").text
        value = published.Wanted(
            at=time.time(), by="c1", target_s=60, selectors={"": 3, "gpu=yes,zone=a": 1}
        )
        r.set(keys.wanted, published.encode(value), px=30_000)
        body = web.get("/api/autoscale").json()
        assert (body["published"], body["wanted"], body["by"]) == (True, 3, "c1")
        gpu = web.get("/api/autoscale", params={"selector": "zone=a,gpu=yes"}).json()
        assert (gpu["selector"], gpu["wanted"]) == ("gpu=yes,zone=a", 1)
        assert web.get("/api/autoscale", params={"selector": "x=1"}).json()["wanted"] == 0
        bad = web.get("/api/autoscale", params={"selector": "gpu"})
        assert bad.status_code == 400 and "selector" in bad.text
        text = web.get("/metrics").text
        assert 'queueworks_workers_wanted{selector=""} 3' in text
        assert 'queueworks_workers_wanted{selector="gpu=yes,zone=a"} 1' in text
    shown = json.loads(render(client, as_json=True))["wanted_workers"]
    assert shown["selectors"] == {"": 3, "gpu=yes,zone=a": 1}
    assert "wanted workers: (any)=3 gpu=yes,zone=a=1" in render(client)


@pytest.mark.system
def test_the_controller_counts_a_backlog_without_any_worker(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """The count the controller writes: fenced, with its expiry, from a queue's backlog
    and due delayed jobs while no worker runs; zero once they are gone."""
    cluster.controller()
    q = client.queue("backlog", min_nodes=2)
    wait_for(lambda: published.read(r, keys), 30, "a first count")
    assert published.read(r, keys).of("") == 0  # type: ignore[union-attr]
    q.enqueue("tests.handlers:double", {"x": 1})
    wait_for(lambda: published.read(r, keys).of("") == 2, 10, "the queue's 2")  # type: ignore[union-attr]
    ttl = r.pttl(keys.wanted)
    assert 0 < ttl <= 30_000, ttl
    entry: Any = r.xrange(keys.task("backlog").stream)
    r.xdel(keys.task("backlog").stream, entry[0][0])
    q.enqueue("tests.handlers:double", {"x": 2}, delay=4.0)  # counted once it is due
    wait_for(lambda: published.read(r, keys).of("") == 0, 10, "zero while it waits")
    wait_for(lambda: published.read(r, keys).of("") == 2, 10, "2 once it is due")


@pytest.mark.system
@pytest.mark.slow(30)
def test_among_many_idle_queues_a_job_on_any_is_counted_at_the_next_pass(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """1,000 idle queues and no worker: the controller reads a few of them a second in turn
    (not 200), yet a job on any of them, of any priority, is counted within a couple of
    passes (notified; the turn would take 20 s), a delayed one once it is due, and the
    count goes back to zero when the job goes."""
    names = [f"tenant-{i:04d}" for i in range(1000)]
    for name in names:
        client.queue(name)
    cluster.controller()
    wait_for(lambda: published.read(r, keys), 30, "a first count")

    def wanted_now() -> int:
        value = published.read(r, keys)
        return value.of("") if value is not None else -1

    def xlen_calls() -> int:
        stats: Any = r.info("commandstats")
        return int(stats.get("cmdstat_xlen", {}).get("calls", 0))

    wait_for(lambda: wanted_now() == 0, 30, "zero wanted")
    time.sleep(2.0)  # the first passes read every queue once
    before, t = xlen_calls(), time.monotonic()
    time.sleep(3.0)
    rate = (xlen_calls() - before) / (time.monotonic() - t)
    assert rate < 120, f"{rate:.0f} XLEN/s with 1,000 idle queues (a turn of 200 reads 200/s)"

    for name, kw in ((names[500], {}), (names[731], {"priority": 3}), (names[77], {"delay": 3.0})):
        q = client.queue(name)
        job = q.enqueue("tests.handlers:double", {"x": 1}, **kw)
        t = time.monotonic()
        if "delay" in kw:
            time.sleep(1.5)
            assert wanted_now() == 0  # not due yet
        wait_for(lambda: wanted_now() >= 1, 6, f"{name}'s job counted ({kw})", interval=0.05)
        took = time.monotonic() - t
        assert took < (5.0 if "delay" in kw else 3.0), (name, kw, took)
        assert job.cancel()
        wait_for(lambda: wanted_now() == 0, 10, f"zero again after {name}'s job")

    assert cluster.procs[-1].alive()


def keda_manifest() -> list[dict[str, Any]]:
    """The ScaledObject and TriggerAuthentication that docs/deploy.md shows."""
    import yaml

    text = (ROOT / "docs" / "deploy.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    (block,) = [b for b in blocks if "kind: ScaledObject" in b]
    return list(yaml.safe_load_all(block))


@pytest.mark.integration
def test_the_keda_manifest_in_the_docs_reads_the_count(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    """What KEDA's metrics-api scaler and the HPA do with the documented manifest, against a
    live dashboard: GET the url with the bearer token, take ``valueLocation`` from the JSON,
    and (``AverageValue``) scale to ceil(value / targetValue) -- the wanted count itself,
    whatever the current replicas. KEDA itself is not run here."""
    import math
    from urllib.parse import urlsplit

    from tests.test_dashboard import make_app

    scaled, auth = keda_manifest()
    assert (scaled["kind"], auth["kind"]) == ("ScaledObject", "TriggerAuthentication")
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "metrics-api" and meta["authMode"] == "bearer"
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert [p["parameter"] for p in auth["spec"]["secretTargetRef"]] == ["token"]
    assert trigger.get("metricType", "AverageValue") == "AverageValue"
    assert scaled["spec"]["minReplicaCount"] == 0  # to zero when idle
    url = urlsplit(meta["url"])
    path = f"{url.path}?{url.query}"
    with make_app(client, token="keda-s3cret") as web:
        assert web.get(path).status_code == 401  # no token, no count
        bearer = {"Authorization": "Bearer keda-s3cret"}
        for count in (3, 0, 7):
            value = published.Wanted(at=time.time(), by="c1", target_s=60, selectors={"": count})
            r.set(keys.wanted, published.encode(value), px=30_000)
            body = web.get(path, headers=bearer).json()
            metric = float(body[meta["valueLocation"]])  # a top-level GJSON path
            assert math.ceil(metric / float(meta["targetValue"])) == count
