"""docs/peers.md from results.json (standard library only); docs/peers.png is drawn by
``chart.py`` in the report venv (matplotlib).

    python -m bench.peers.report [bench/peers/results.json]   # re-render, no measuring
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "peers.md"
PNG = ROOT / "docs" / "peers.png"
ASYNC_RESULTS = ROOT / "bench" / "asyncpeers_results.json"  # python -m bench.asyncpeers
QW = "queueworks"
QUEUE = "queueworks-queue"  # queueworks' queue: shown beside the peers, not ranked against them
OURS = (QW, QUEUE)

HOW = {
    "queueworks": (
        "`python -m queueworks controller` + N x `python -m queueworks worker`; a job is a"
        " *subtask*: throughput and enqueue put all N in one task (`Client.submit(TaskSpec(...))`,"
        " handler `queueworks.examples:noop`); latency submits one task of one subtask per job;"
        " defaults otherwise (`min_nodes=1`, `max_nodes=None`, heartbeat TTL 3 s). The extra"
        " throughput row submits one task of one subtask per job with `max_nodes=1`, so the two"
        " workers run two tasks at once"
    ),
    "queueworks-queue": (
        'the same processes; a job is a job of a queue (`q = client.queue("bench")`, default'
        " settings), its members already blocked on the queue's stream: throughput calls"
        " `q.enqueue(handler, payload)` once per job (each call returns before the next), where"
        " the other rows use their bulk enqueue if they have one; enqueue and memory use"
        " `q.enqueue_many`; latency and recovery `q.enqueue` one job each"
    ),
    "rq": "N x `rq worker` (default `Worker`: forks a work horse per job); `Queue.enqueue_many`"
    " in batches of 1,000",
    "rq-simple": "N x `rq worker -w rq.SimpleWorker` (runs jobs in the worker process);"
    " `Queue.enqueue_many` in batches of 1,000",
    "celery": "one `celery worker` node with a prefork pool of N (`-c N`; two nodes of `-c 1`"
    " for the kill test), Redis broker, `task_acks_late=True`, other settings default;"
    " `apply_async` in a loop on one producer (Celery has no bulk publish)",
    "dramatiq": "one `dramatiq` command with `--processes N` (8 threads each, the default; two"
    " commands of one process for the kill test), Redis broker, default middleware;"
    " `actor.send` in a loop (no bulk API)",
    "arq": "N x `arq WorkerSettings` (asyncio, `max_jobs=10`), logging at WARNING;"
    " `enqueue_job` (no bulk API), 100 calls in flight at a time",
    "streaq": "N x a worker process doing what `streaq run` does, logging at WARNING"
    " (concurrency 16); `Worker.enqueue_many` in batches of 1,000",
}


def _num(x: float | None, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def _err(result: dict[str, Any] | None) -> str | None:
    if result is None:
        return "not run"
    if "error" in result:
        return f"failed: {result['error']}"
    return None


def one_line(name: str, r: dict[str, Any]) -> str:
    if (e := _err(r)) is not None:
        return e
    if name.startswith("throughput"):
        capped = f" (capped: {r['done']:,} of {r['jobs']:,} done)" if r.get("capped") else ""
        return f"{r['jobs_per_s']:,.0f} jobs/s{capped}"
    if name == "enqueue":
        return f"{r['jobs_per_s']:,.0f} jobs/s, {r['mb_per_100k']:.1f} MB per 100k"
    if name == "latency":
        return f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms"
    if name == "recovery":
        if r["recovered"]:
            return f"job ran again after {r['seconds']:.1f} s"
        return f"not re-run within {r['gave_up_after_s']:.0f} s: {r['state']}"
    return str(r)


def _cell(r: dict[str, Any] | None, fmt: Callable[[dict[str, Any]], str]) -> str:
    if (e := _err(r)) is not None or r is None:
        return e or "-"
    return fmt(r)


def _throughput(r: dict[str, Any] | None) -> str:
    if (e := _err(r)) is not None or r is None:
        return e or "-"
    star = "*" if r.get("capped") else ""
    return f"{_num(r['jobs_per_s'])}{star}"


def _recovery(r: dict[str, Any] | None) -> str:
    if (e := _err(r)) is not None or r is None:
        return e or "-"
    if r["recovered"]:
        return f"{r['seconds']:.1f} s"
    return f"not within {r['gave_up_after_s']:.0f} s"


def _recovery_seconds(r: dict[str, Any] | None) -> float | None:
    if r is None or "error" in r:
        return None
    return float(r["seconds"]) if r["recovered"] else math.inf


def version_of(doc: dict[str, Any], key: str) -> str:
    info = doc["systems"][key]
    return str(info["versions"].get(info["package"], "?"))


def _get(doc: dict[str, Any], key: str, name: str) -> dict[str, Any] | None:
    result: dict[str, Any] | None = doc["results"].get(key, {}).get(name)
    return result


def _metric(doc: dict[str, Any], key: str, name: str, field: str) -> float | None:
    r = _get(doc, key, name)
    if r is None or "error" in r:
        return None
    return float(r[field])


def leads(doc: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(peer, metric, ratio text, queueworks leads?) for the three acceptance metrics."""
    rows: list[tuple[str, str, str, bool | None]] = []
    for key in doc["results"]:
        if key in OURS:
            continue
        for label, name, field in (
            ("2-worker throughput", "throughput_2", "jobs_per_s"),
            ("enqueue rate", "enqueue", "jobs_per_s"),
        ):
            ours, theirs = _metric(doc, QW, name, field), _metric(doc, key, name, field)
            if ours is None or theirs is None:
                rows.append((key, label, "-", None))
            else:
                rows.append((key, label, f"{ours / theirs:,.1f}x", ours > theirs))
        ours_s = _recovery_seconds(_get(doc, QW, "recovery"))
        theirs_s = _recovery_seconds(_get(doc, key, "recovery"))
        if ours_s is None or theirs_s is None:
            rows.append((key, "recovery time", "-", None))
        elif math.isinf(theirs_s):
            rows.append(
                (key, "recovery time", "never (peer did not re-run it)", not math.isinf(ours_s))
            )
        else:
            rows.append(
                (key, "recovery time", f"{theirs_s / ours_s:,.1f}x faster", ours_s < theirs_s)
            )
    return rows


def _asyncio(adoc: dict[str, Any] | None) -> list[str]:
    """The asyncio run's medians (``bench.asyncpeers``), if there is one: its own run,
    its own date; the full table and the CPU per job are in BENCHMARKS.md."""
    if adoc is None:
        return []
    p, results = adoc["params"], adoc["results"]
    labels = {k: v["label"] for k, v in adoc["systems"].items()}
    modes = [f"producers_{n}" for n in p["producers"]]
    out = [
        "## asyncio: queueworks against arq, saq and streaq\n",
        f"A separate run, {adoc['date']}, `{adoc['command']}` ({p['repeat']} rounds, the"
        f" systems interleaved): {p['n']:,} `async def` no-op jobs, each enqueued by one"
        " awaited call of the system's asyncio client (queueworks `AsyncClient`"
        " `await q.enqueue(...)`, arq `enqueue_job`, saq `enqueue`, streaq `task.enqueue`)"
        f" from P producer coroutines; {p['workers']} worker processes with"
        f" {p['concurrency']} jobs in flight each (`worker --concurrency`, `max_jobs`,"
        " `concurrency`). Median jobs/s, first enqueue to last done (* = stopped at the"
        f" {p['budget_s']:.0f} s budget):\n",
        "| system | version | " + " | ".join(f"P = {n}" for n in p["producers"]) + " |",
        "| --- | --- |" + " ---: |" * len(modes),
    ]
    for key, per in results.items():
        cells = []
        for name in modes:
            ok = [r for r in per.get(name, []) if "error" not in r]
            capped = "*" if any(r.get("capped") for r in ok) else ""
            rate = statistics.median(r["jobs_per_s"] for r in ok) if ok else None
            cells.append("failed" if rate is None else f"{rate:,.0f}{capped}")
        info = adoc["systems"][key]
        version = info["versions"].get(info["package"], "") if key != "raw" else ""
        out.append(f"| {labels[key]} | {version} | {' | '.join(cells)} |")
    out.append(
        "\nWith concurrent producers a queueworks round trip carries the jobs of every call"
        " in flight (one Lua call), and a worker reads and settles them in batches; with one"
        " producer every system pays a round trip per job, and even the raw limit (one"
        " awaited `XADD` per job, no job record) is only a few times the best peer. The"
        " ratios per round, the CPU each side spent per job and whether issue 20's target"
        " (≥ 5x the best peer) is met: [BENCHMARKS.md](../BENCHMARKS.md#asyncio-async-no-op-"
        "throughput-against-arq-saq-and-streaq-issue-20).\n"
    )
    return out


def markdown(doc: dict[str, Any], asyncio: dict[str, Any] | None = None) -> str:
    """The page; ``asyncio``: the results of ``bench.asyncpeers``, shown in a section."""
    p, m = doc["params"], doc["machine"]
    keys = list(doc["results"])
    labels = {k: doc["systems"][k]["label"] for k in keys}
    loads = [
        r["load_1m"] for per in doc["results"].values() for r in per.values() if "load_1m" in r
    ]
    out: list[str] = []
    add = out.append
    add("# queueworks side by side with RQ, Celery, Dramatiq, arq and streaq\n")
    add(
        f"Measured in **one run on one machine** on {doc['date']} with `{doc['command']}`"
        f" ({doc['duration_s'] / 60:.1f} min, venvs included)"
        f"{', quick sizes' if doc['quick'] else ''}."
        " Every number and every ratio on this page comes from that run; rerun the command to"
        " refresh the page.\n"
    )
    add(
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['os']}, Python"
        f" {m['python']}, redis-server {m['redis_server']} (a fresh private server for every"
        " workload of every system)."
        f" **Shared machine:** other engineers' test suites ran on the same cores; load average"
        f" (1 min) was {doc['load_start'][0]:.1f} at the start and {doc['load_end'][0]:.1f} at"
        f" the end, between {min(loads, default=0):.1f} and {max(loads, default=0):.1f} when"
        " the workloads started (per-row values in `bench/peers/results.json`). Absolute"
        " numbers are therefore lower and noisier than on an idle machine; all systems ran"
        " under the same conditions, interleaved workload by workload.\n"
    )
    add("## Headline\n")
    add(
        "| system | version | no-op throughput, 2 workers (jobs/s) | enqueue (jobs/s) |"
        " latency p50 / p99 (ms) | job runs again after SIGKILL | Redis MB per 100k queued |"
    )
    add("| --- | --- | ---: | ---: | ---: | --- | ---: |")
    for k in keys:
        lat, enq = _get(doc, k, "latency"), _get(doc, k, "enqueue")
        lat_s = _cell(lat, lambda r: f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}")
        enq_rate = _cell(enq, lambda r: _num(r["jobs_per_s"]))
        mem = _cell(enq, lambda r: f"{r['mb_per_100k']:.1f}")
        name = f"**{labels[k]}**" if k in OURS else labels[k]
        add(
            f"| {name} | {version_of(doc, k)} | {_throughput(_get(doc, k, 'throughput_2'))} |"
            f" {enq_rate} | {lat_s} | {_recovery(_get(doc, k, 'recovery'))} | {mem} |"
        )
    add(
        f"\nJobs are no-ops; {p['throughput_n']:,} for throughput, {p['enqueue_n']:,} for enqueue"
        f" and memory; latency at {p['latency_rate']:.0f} jobs/s on one worker process; recovery"
        f" gives up at {p['give_up_s']:.0f} s. * = stopped at the {p['throughput_budget_s']:.0f} s"
        " budget, rate from the jobs done by then. A queueworks job is a *subtask*: the"
        " throughput and enqueue jobs are the subtasks of one task, its unit of work (each"
        " subtask still gets its own delivery, ack, attempt count and stored result). Used as a"
        " plain job queue, one task per job, each job pays a task's path (the controller, a"
        " join, a leave): see section 1."
        + (
            " The queue row is queueworks' queue used the way the peers are: its throughput"
            " enqueues **one call per job** (`q.enqueue`), where RQ and streaq use their bulk"
            " `enqueue_many`; its enqueue column is `q.enqueue_many`.\n"
            if QUEUE in doc["results"]
            else "\n"
        )
    )
    out.extend(_ratios(doc, labels))
    out.extend(_details(doc, labels))
    add("## How each system runs\n")
    add(
        "Each peer is installed from PyPI, pinned, in its own venv (`bench/peers/venvs.py`);"
        " every venv also gets `hiredis`, the reply parser queueworks uses. Worker processes"
        " run with logging at WARNING where a peer logs a line per job by default (so the"
        " logging is not what is measured). A *worker process* is a process that runs jobs.\n"
    )
    for k in keys:
        add(f"- **{labels[k]}**: {HOW.get(k, '')}.")
    add("")
    add(
        "Workloads (`bench/peers/harness.py`, one implementation for all systems):\n\n"
        "1. **Throughput**: workers booted and warmed (a few jobs each), then the clock runs"
        " from the first enqueue call until the last job is finished — as each system defines"
        " finished in Redis (queueworks: the task's `done`; RQ: finished registry; Celery:"
        " queue and `unacked` empty; Dramatiq: message hash empty; arq: queue zset empty;"
        " streaq: stream empty). Enqueueing is inside the clock for every system.\n"
        "2. **Enqueue**: no workers; the producer's bulk API where there is one; the same"
        " run gives workload 5.\n"
        "3. **Latency**: one producer sends one job every 1/rate s; a sample is the handler's"
        " start time minus the send time (one clock: same machine). The queueworks row submits"
        " each job as a task of one subtask, so each sample includes the controller giving the"
        " task a node and the worker joining its node set (a few ms); the queue row enqueues"
        " each on a queue whose member is already blocked on its stream.\n"
        "4. **Recovery**: two independent worker instances; a job that sleeps; once it runs,"
        " SIGKILL the worker holding it (its whole process group, and the job's own group"
        " where it runs in a separate session, as RQ's work horse does — as when a container"
        " dies). The time is until the job *starts again* anywhere, with every system's"
        " default settings; the test gives up at the limit and records where the job is.\n"
        "5. **Memory**: `used_memory` after minus before enqueueing, per 100,000 jobs with one"
        " small integer argument each.\n"
    )
    out.extend(_versions(doc, labels))
    out.extend(_asyncio(asyncio))
    add("## Reproduce\n")
    add(
        "```\npython -m bench.peers.run           # full run, writes results.json, this page,"
        " docs/peers.png\npython -m bench.peers.run --quick   # small sizes, ~5 min\n"
        "python -m bench.asyncpeers          # the asyncio section (~5 min), then re-render\n"
        "```\n\n"
        "Venvs are created under `bench/peers/.venvs/` (reused while the pins are unchanged);"
        " worker and driver logs go to `bench/out/peers/`. The run measures a copy of"
        " `queueworks/`, `controller/`, `workers/` and `bench/` taken when it starts, so one"
        " run measures one version of the code; the version column says which commit, and"
        " whether the work tree had uncommitted changes. `python -m bench.peers.report`"
        " re-renders this page and the chart from `bench/peers/results.json` without"
        " measuring.\n"
    )
    return "\n".join(out) + "\n"


def _ratios(doc: dict[str, Any], labels: dict[str, str]) -> list[str]:
    rows = leads(doc)
    out = ["## queueworks against each peer\n"]
    out.append(
        "Ratios from this run: queueworks ÷ peer for the rates; peer's time ÷ queueworks' time"
        " for recovery.\n"
    )
    out.append("| peer | 2-worker throughput | enqueue rate | recovery time |")
    out.append("| --- | ---: | ---: | ---: |")
    by_peer: dict[str, dict[str, tuple[str, bool | None]]] = {}
    for key, metric, ratio, lead in rows:
        by_peer.setdefault(key, {})[metric] = (ratio, lead)
    for key, cells in by_peer.items():

        def cell(metric: str, cells: dict[str, tuple[str, bool | None]] = cells) -> str:
            ratio, lead = cells[metric]
            return ratio if lead is not False else f"{ratio} (behind)"

        out.append(
            f"| {labels[key]} | {cell('2-worker throughput')} | {cell('enqueue rate')} |"
            f" {cell('recovery time')} |"
        )
    behind = [(k, metric) for k, metric, _, lead in rows if lead is False]
    out.append("")
    if not behind:
        out.append(
            "queueworks leads every peer on 2-worker throughput, enqueue rate and recovery"
            " time in this run.\n"
        )
    else:
        for key, metric in behind:
            note = NOTES.get((key, metric), NOTES.get(("*", metric), ""))
            out.append(f"- **Behind {labels[key]} on {metric}.** {note}")
        out.append("")
    out.append("Why the gaps are what they are:\n")
    out.extend(f"- {why}" for why in WHY)
    out.append("")
    out.extend(_latency_note(doc, labels))
    out.extend(_queue_note(doc, labels))
    return out


NOTES: dict[tuple[str, str], str] = {
    ("*", "2-worker throughput"): (
        "queueworks' workers read batches sized to ~0.2 s of work and settle each batch in one"
        " Lua call; a peer ahead here is one whose per-job cost fell below that, or a run where"
        " queueworks' fixed start-up (the controller giving the task its node set, ~10 ms) was"
        " a large share of a short run. What it would take: a larger n (the fixed cost"
        " amortised), or a larger `batch_size`."
    ),
    ("*", "enqueue rate"): (
        "queueworks submits 1,000 subtasks per Lua call, 8 calls per round trip; a peer ahead"
        " here pipelines more per round trip. What it would take: larger `SUBMIT_BATCH` /"
        " `SUBMIT_PIPELINE` in `queueworks/client/sync.py`."
    ),
    ("*", "recovery time"): (
        "queueworks re-runs a dead member's subtask within heartbeat TTL (3 s) + one tick (1 s);"
        " a peer ahead here used a shorter timeout. What it would take: a shorter"
        " `QUEUEWORKS_HEARTBEAT_TTL` (and interval)."
    ),
}

WHY = (
    "**Throughput.** A queueworks worker reads up to 100 subtasks per `XREADGROUP` (sized to"
    " about 0.2 s of work) and settles what it ran (XACK, results, `done`) in one Lua call per"
    " batch (at least every 50 ms), so a no-op costs a fraction of a round trip. The peers"
    " spend several round trips per job:"
    " RQ writes a job hash and moves it across registries, and its default `Worker` forks a"
    " process per job; Celery with `acks_late` keeps every message in an `unacked` hash and"
    " index until its ack; Dramatiq runs a Lua dispatch per fetch and per ack; arq polls its"
    " queue every `poll_delay=0.5` s, takes at most `queue_read_limit=100` jobs per poll and"
    " starts each in its own WATCH/MULTI transaction; streaq acks, deletes and stores a result"
    " per task in its own transaction.",
    "**Enqueue and memory.** queueworks writes 1,000 subtasks per Lua call, 8 calls per round"
    " trip, and a subtask is one small stream entry (a listpack node packs many entries and"
    " shares their field names), so a queued job costs tens of bytes. RQ, Dramatiq and arq keep"
    " a hash or string per job plus a list or sorted-set entry; Celery pushes its whole message"
    " envelope (headers, properties, body: about 1 KB) per job; streaq keeps a stream entry"
    " plus a task-data string per job.",
    "**Recovery.** A queueworks worker holds a heartbeat key with a 3 s TTL; the other members"
    " check the node set every 1 s tick (EXISTS expires a dead key on the spot), prune the dead"
    " member and claim its pending entries at once (XPENDING + XCLAIM), so the job runs again"
    " within TTL + one tick. With their defaults the peers wait for a long timeout or never"
    " redeliver; section 4 says where each job was left.",
)


KNOBS = {
    "queueworks": "`heartbeat_ttl` (3 s) + `heartbeat_interval` (1 s): the job runs again within"
    " their sum",
    "queueworks-queue": "the same: a member's running job runs again within `heartbeat_ttl` +"
    " one tick",
    "rq": "no redelivery by default: enqueue with `retry=Retry(max=...)`, and the abandoned-job"
    " check waits for the job's registry deadline and the next `maintenance_interval` (600 s)",
    "rq-simple": "as for the forking worker: `Retry` plus the registry deadline and"
    " `maintenance_interval` (600 s)",
    "celery": "`broker_transport_options={'visibility_timeout': ...}` (3,600 s); lower it only"
    " above your longest job, or long jobs run twice",
    "dramatiq": "`RedisBroker(heartbeat_timeout=...)` (60 s) and `maintenance_chance` (1,000 per"
    " million commands: an idle worker polls about once a second)",
    "arq": "`job_timeout` (300 s): the in-progress key lives `job_timeout` + 10 s",
    "streaq": "`Worker(idle_timeout=...)` (60 s); in-flight tasks are kept claimed every 0.9 x"
    " idle_timeout",
}


def _tasks_note(doc: dict[str, Any], labels: dict[str, str]) -> list[str]:
    ours = _metric(doc, QW, "throughput_2_tasks", "jobs_per_s")
    if ours is None:
        return []
    ahead = [
        labels[k]
        for k in doc["results"]
        if k not in OURS
        and (theirs := _metric(doc, k, "throughput_2", "jobs_per_s")) is not None
        and theirs > ours
    ]
    behind = f", behind {', '.join(ahead)}" if ahead else ""
    return [
        f"**One task per job: {ours:,.0f} jobs/s on 2 workers{behind}.** Every task goes"
        " through the controller: it is given a node, the worker joins its node set, runs the"
        " subtask, the task completes, the worker leaves, the controller releases it. The"
        " controller's share is small (a pass reads only what its events name; see"
        " `python -m bench.scale tasks` for each phase); the worker's join, re-rank, read,"
        " settle and leave for every one-job task are most of it. A task is for many"
        " subtasks; jobs that arrive one by one go to a **queue** (`client.queue(...)`, the"
        " queue row: a long-lived task whose stream takes jobs appended one at a time, with"
        " no controller on the job path).\n"
    ]


def _latency_note(doc: dict[str, Any], labels: dict[str, str]) -> list[str]:
    ours = _metric(doc, QW, "latency", "p50_ms")
    if ours is None:
        return []
    ahead = [
        labels[k]
        for k in doc["results"]
        if k not in OURS
        and (theirs := _metric(doc, k, "latency", "p50_ms")) is not None
        and theirs < ours
    ]
    if not ahead:
        return ["queueworks has the lowest p50 latency in this run.\n"]
    return [
        f"**Latency: behind {', '.join(ahead)} at p50.** A queueworks job submitted on its own"
        " is a task: the controller wakes on the `submitted` event and acts at once (passes"
        " are at least 5 ms apart, so only a burst waits: `controller/main.py`,"
        " `_wait_for_events`), gives the task a node, and the worker, woken by a keyspace"
        " notification on its assign key, joins the node set, re-ranks and reads. That is"
        " several round trips and thread wake-ups where a queue that hands a job to a reader"
        " already blocked on it needs one; and one worker runs one task at a time, so a stall"
        " (a busy shared core) delays every task behind it, which is the p99. Jobs that come"
        " one at a time go to a queue instead: its members are already blocked on its stream"
        " and start a job in about one round trip (the queue row).\n"
    ]


def _queue_note(doc: dict[str, Any], labels: dict[str, str]) -> list[str]:
    ours = _metric(doc, QUEUE, "throughput_2", "jobs_per_s")
    p50 = _metric(doc, QUEUE, "latency", "p50_ms")
    if ours is None or p50 is None:
        return []
    peers = [k for k in doc["results"] if k not in OURS]
    faster = [
        labels[k]
        for k in peers
        if (v := _metric(doc, k, "throughput_2", "jobs_per_s")) and v > ours
    ]
    sooner = [labels[k] for k in peers if (v := _metric(doc, k, "latency", "p50_ms")) and v < p50]
    p99 = _metric(doc, QUEUE, "latency", "p99_ms") or math.nan
    rate = f"behind {', '.join(faster)}" if faster else "ahead of every peer"
    lat = f"behind {', '.join(sooner)}" if sooner else "the lowest p50 of this run"
    return [
        f"**queueworks' queue, one call per job: {ours:,.0f} jobs/s on 2 workers ({rate}, though"
        " RQ and streaq enqueue in bulk here), latency p50 / p99"
        f" {p50:.1f} / {p99:.1f} ms ({lat}).** A queue is a long-lived task whose members are"
        " already blocked on its stream: `q.enqueue` is one `XADD` (a job is its stream entry"
        " until it settles), and a job starts about one round trip later, with no controller on"
        " the job path. Every system measured the same way, one call per job, side by side"
        " with the raw limit (one `XADD` per job): `python -m bench.queue`, figures in"
        " BENCHMARKS.md.\n"
    ]


def _details(doc: dict[str, Any], labels: dict[str, str]) -> list[str]:
    out = ["## 1. No-op throughput\n"]
    out.append(
        "| system | 1 worker (jobs/s) | 2 workers (jobs/s) | 2 workers: seconds |"
        " of which enqueueing |"
    )
    out.append("| --- | ---: | ---: | ---: | ---: |")
    for k in labels:
        two = _get(doc, k, "throughput_2")
        secs = enq = "-"
        if two and "error" not in two:
            secs, enq = f"{two['seconds']:.2f}", f"{two['enqueue_seconds']:.2f}"
        out.append(
            f"| {labels[k]} | {_throughput(_get(doc, k, 'throughput_1'))} |"
            f" {_throughput(two)} | {secs} | {enq} |"
        )
        tasks = _get(doc, k, "throughput_2_tasks")
        if k == QW and tasks is not None:
            secs = enq = "-"
            if "error" not in tasks:
                secs, enq = f"{tasks['seconds']:.2f}", f"{tasks['enqueue_seconds']:.2f}"
            out.append(
                f"| {labels[k]}, one task per job ({tasks.get('jobs', 0):,} tasks,"
                f" `max_nodes=1`) | | {_throughput(tasks)} | {secs} | {enq} |"
            )
    out.append("")
    out.extend(_tasks_note(doc, labels))
    out.append("\n## 2. Enqueue rate and 5. Redis memory\n")
    out.append("| system | jobs/s | seconds | MB per 100k jobs | bytes per job |")
    out.append("| --- | ---: | ---: | ---: | ---: |")
    for k in labels:
        r = _get(doc, k, "enqueue")
        if (e := _err(r)) is not None or r is None:
            out.append(f"| {labels[k]} | {e} | | | |")
            continue
        out.append(
            f"| {labels[k]} | {_num(r['jobs_per_s'])} | {r['seconds']:.2f} |"
            f" {r['mb_per_100k']:.1f} | {r['bytes_per_job']:.0f} |"
        )
    out.append("\n## 3. End-to-end latency (enqueue call to handler start)\n")
    out.append("| system | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) |")
    out.append("| --- | ---: | ---: | ---: | ---: |")
    for k in labels:
        r = _get(doc, k, "latency")
        if (e := _err(r)) is not None or r is None:
            out.append(f"| {labels[k]} | {e} | | | |")
            continue
        out.append(
            f"| {labels[k]} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} | {r['p99_ms']:.1f} |"
            f" {r['max_ms']:.1f} |"
        )
    out.append("\n## 4. Recovery after SIGKILL (default settings)\n")
    out.append(
        "| system | job starts again after | state of the job at the end | the setting that"
        " decides it |"
    )
    out.append("| --- | --- | --- | --- |")
    for k in labels:
        r = _get(doc, k, "recovery")
        state = "" if r is None or "error" in r or r["recovered"] else r["state"]
        out.append(f"| {labels[k]} | {_recovery(r)} | {state} | {KNOBS.get(k, '')} |")
    out.append("")
    return out


def _versions(doc: dict[str, Any], labels: dict[str, str]) -> list[str]:
    out = ["## Versions\n", "| system | package | redis-py | hiredis | errors |"]
    out.append("| --- | --- | --- | --- | --- |")
    for k in labels:
        info = doc["systems"][k]
        v = info["versions"]
        extra = {
            "streaq": f" (its own client: coredis {v.get('coredis', '?')})",
            "celery": f" (kombu {v.get('kombu', '?')})",
        }.get(k, "")
        out.append(
            f"| {labels[k]} | {info['package']} {version_of(doc, k)}{extra} |"
            f" {v.get('redis', '-')} | {v.get('hiredis', '-')} | {info.get('error', '')} |"
        )
    out.append("")
    return out


def main() -> None:
    """Re-render the page and the chart from an existing results.json (no measuring)."""
    import json
    import sys

    from bench.peers.venvs import DEFAULT_DIR, VENVS

    results = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench/peers/results.json"
    chart_python = VENVS["report"].python(DEFAULT_DIR)
    written = write(
        json.loads(results.read_text()), results, chart_python if chart_python.exists() else None
    )
    print("wrote", *map(str, written))


def write(doc: dict[str, Any], results: Path, chart_python: Path | None) -> list[Path]:
    """docs/peers.md, and docs/peers.png drawn from ``results`` by the report venv's python."""
    adoc = json.loads(ASYNC_RESULTS.read_text()) if ASYNC_RESULTS.exists() else None
    DOC.write_text(markdown(doc, adoc))
    if chart_python is None:
        return [DOC]
    subprocess.run(
        [str(chart_python), "-m", "bench.peers.chart", str(results), str(PNG)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"},
        check=True,
    )
    return [DOC, PNG]


if __name__ == "__main__":
    main()
