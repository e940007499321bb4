"""``queueworks info``: tasks, queues and workers as text (or JSON), like ``rq info``.

A queue is a task (mode "queue"), but it is listed with the queues, not among the tasks."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click
from pydantic import BaseModel

from queueworks.cli.options import client_for, common, option, seconds, settings_from_flags
from queueworks.client.sync import Client
from queueworks.protocol.models import (
    JobStatus,
    NodeInfo,
    QueueStatus,
    Schedule,
    TaskState,
    WorkerRecord,
)
from queueworks.protocol.wanted import Wanted
from queueworks.protocol.wanted import read as read_wanted
from queueworks.task.tasks import Backend
from queueworks.transport.lost_workers import WINDOW, LostWorker
from queueworks.transport.pools import PoolRecord, read_pools

NO_CONTROLLER = (
    "no controller is running: no task or queue gets nodes (or more of them) until one is "
    "(`queueworks controller`)"
)


def controller_running(client: Backend) -> bool:
    """Whether some controller holds the leader lease."""
    return bool(client.redis.exists(client.keys.leader))


class ControllerWatch:
    """What a command that waits says about the controller: ``NO_CONTROLLER`` each time it
    finds none running (once, until one runs again)."""

    def __init__(self, client: Backend, say: Callable[[str], None]) -> None:
        self.client, self.say, self.missing = client, say, False

    def look(self) -> None:
        missing = not controller_running(self.client)
        if missing and not self.missing:
            self.say(NO_CONTROLLER)
        self.missing = missing


def _bar(done: int, dead: int, total: int, width: int = 20) -> str:
    """``#`` for done, ``x`` for dead, ``.`` for the rest: a task whose subtasks all died
    does not look finished well."""
    if total <= 0:
        return "." * width
    ok = round(done / total * width)
    bad = min(width - ok, round((done + dead) / total * width) - ok)
    if dead and not bad:
        bad, ok = 1, min(ok, width - 1)  # one dead subtask still shows
    return "#" * ok + "x" * bad + "." * (width - ok - bad)


def _nodes(nodes: list[NodeInfo]) -> list[str]:
    out = []
    for n in nodes:
        age = f"{n.heartbeat_age:.1f}s" if n.heartbeat_age is not None else "-"
        out.append(f"      rank {n.rank}: {n.worker}  hb {age}  current={n.current or '-'}")
    return out


def _why(state: TaskState, reason: str | None) -> list[str]:
    """Why a task (or queue) waits for nodes, or why it failed."""
    if reason and state == TaskState.FAILED:
        return [f"      failed: {reason}"]
    if reason and not state.finished:
        return [f"      waiting: {reason}"]
    return []


def _printable(value: str, width: int = 80) -> str:
    """A stored text as one terminal line: control characters (escapes) shown as ``?``."""
    shown = "".join(c if c.isprintable() else "?" for c in value[:width])
    return shown + ("..." if len(value) > width else "")


def _running(jobs: list[JobStatus], now: float) -> list[str]:
    """A queue's running jobs, with their progress."""
    lines = []
    for j in jobs:
        since = f" for {now - j.started_at:.1f}s" if j.started_at else ""
        line = f"      running {j.id} {_printable(j.handler)} on {j.worker} attempt {j.attempts}"
        line += since
        if j.progress is not None:
            filled = round(j.progress * 10)
            line += f" [{'#' * filled}{'.' * (10 - filled)}] {100 * j.progress:.0f}%"
        if j.progress_message:
            line += f" {_printable(j.progress_message)}"
        lines.append(line)
    return lines


def _queues(
    queues: list[QueueStatus],
    schedules: dict[str, list[Schedule]],
    running: dict[str, list[JobStatus]],
    now: float,
) -> list[str]:
    from queueworks.cli.schedules import describe

    lines = [f"{len(queues)} queue(s)"]
    width = max((len(q.name) for q in queues), default=0)
    for q in queues:
        bound = q.max_nodes if q.max_nodes else "-"
        lines.append(
            f"  {q.name:<{width}}  {q.state.value:<9} p={q.priority:<3} backlog={q.backlog} "
            f"scheduled={q.scheduled} deferred={q.deferred} running={q.running} done={q.done} "
            f"dead={q.dead} "
            f"rate(10s)={q.rates.get('10s', 0.0):g}/s "
            f"nodes(now/min/max)={len(q.nodes)}/{q.min_nodes}/{bound} epoch={q.epoch}"
        )
        if q.rejected:
            lines.append(f"      rejected {q.rejected} stream entries that were no job")
        lines += _flow(q)
        lines += _why(q.state, q.reason)
        lines += _nodes(q.nodes)
        lines += _running(running.get(q.name, []), now)
        if schedules.get(q.name):
            lines.append(f"      {len(schedules[q.name])} schedule(s)")
            lines += [f"        {describe(s, now)}" for s in schedules[q.name]]
    return lines


def _flow(q: QueueStatus) -> list[str]:
    """A queue's rate_limit (and whether it holds it back now) and its groups' slots."""
    lines = []
    if q.rate_limit is not None:
        now = " (limited now)" if q.limited else ""
        lines.append(f"      rate_limit={q.rate_limit:g}/s{now}")
    if q.group_limit is not None:
        groups = sorted({*q.groups_running, *q.groups_waiting})
        shown = " ".join(
            f"{_printable(g)}={q.groups_running.get(g, 0)}+{q.groups_waiting.get(g, 0)}"
            for g in groups[:20]
        )
        more = f" (+{len(groups) - 20} more)" if len(groups) > 20 else ""
        lines.append(f"      group_limit={q.group_limit} running+waiting: {shown or '-'}{more}")
    return lines


def wanted_line(wanted: Wanted | None, now: float) -> str:
    """The workers the controller wants, per node selector (what ``autoscale`` runs)."""
    if wanted is None:
        return "wanted workers: none published (no controller leads, or it has not counted)"
    counts = " ".join(f"{name or '(any)'}={n}" for name, n in sorted(wanted.selectors.items()))
    return f"wanted workers: {counts or '(any)=0'}  (counted {max(0.0, now - wanted.at):.1f}s ago)"


def queue_schedules(client: Client, queues: list[QueueStatus]) -> dict[str, list[Schedule]]:
    """Each queue's schedules (a read per queue)."""
    from queueworks.client.queue_handle import Queue
    from queueworks.queue.queue_settings import DEFAULTS

    return {q.name: Queue(client, q.name, DEFAULTS, revives=False).schedules() for q in queues}


def _dumped(by_queue: Mapping[str, Sequence[BaseModel]]) -> dict[str, list[Any]]:
    """Models listed by queue, as JSON values."""
    return {name: [m.model_dump(mode="json") for m in found] for name, found in by_queue.items()}


def render(client: Client, *, as_json: bool = False, limit: int = 100, offset: int = 0) -> str:
    """The ``limit`` newest tasks after ``offset`` (a page of the index), oldest of them
    first, then every queue, then the workers."""
    queues = client.queues()
    schedules = queue_schedules(client, queues)
    names = {q.name for q in queues}
    tasks = [
        t for t in client.tasks(limit=limit, offset=offset, newest_first=True) if t.id not in names
    ]
    tasks.sort(key=lambda t: t.created_at)
    total = client.task_count()
    workers, lost = client.workers(), client.lost_workers()
    pools = read_pools(client.redis, client.keys)
    running = controller_running(client)
    jobs = {q.name: client.running_jobs(q.name) for q in queues if q.running}
    wanted = read_wanted(client.redis, client.keys)  # what `autoscale` runs
    if as_json:
        return json.dumps(
            {
                "controller_running": running,
                "total": total,
                "offset": offset,
                "tasks": [t.model_dump(mode="json") for t in tasks],
                "queues": [q.model_dump(mode="json") for q in queues],
                "schedules": _dumped({n: found for n, found in schedules.items() if found}),
                "running_jobs": _dumped(jobs),
                "workers": [w.model_dump(mode="json") for w in workers],
                "pools": [p.model_dump(mode="json") for p in pools],
                "lost_workers": [w.model_dump(mode="json") for w in lost],
                "wanted_workers": wanted.model_dump(mode="json") if wanted else None,
            },
            indent=2,
        )
    now = time.time()
    shown = f" (the {len(tasks)} newest after {offset})" if len(tasks) < total else ""
    lines = [] if running else [NO_CONTROLLER]
    lines.append(f"{total} task(s){shown}")
    width = max((len(t.name) for t in tasks), default=0)  # names in full, never cut
    for t in tasks:
        nodes = client.task(t.id).status().nodes if not t.finished else []
        size = f"{len(nodes)}/{t.min_nodes}/{t.max_nodes if t.max_nodes else '-'}"
        lines.append(
            f"  {t.id}  {t.name:<{width}}  {t.state.value:<9} p={t.priority:<3} "
            f"[{_bar(t.done, t.dead, t.total)}] {t.done + t.dead}/{t.total} dead={t.dead} "
            f"nodes(now/min/max)={size} epoch={t.epoch}"
        )
        if t.rejected:
            lines.append(f"      rejected {t.rejected} stream entries that were no subtask")
        lines += _why(t.state, t.reason)
        lines += _nodes(nodes)
    lines += _queues(queues, schedules, jobs, now)
    lines += _workers(workers, now) + _pools(pools) + _lost(lost, now)
    lines.append(wanted_line(wanted, now))
    return "\n".join(lines)


def _workers(workers: Sequence[WorkerRecord], now: float) -> list[str]:
    lines = [f"{len(workers)} worker(s)"]
    for w in workers:
        beat = f"{now - w.last_heartbeat:.1f}s ago" if w.last_heartbeat else "-"
        labels = ",".join(f"{k}={v}" for k, v in w.labels.items()) or "-"
        serves = "*" if w.queues is None else ",".join(w.queues) or "-"
        rank = w.rank if w.rank is not None else "-"
        lines.append(
            f"  {w.id:<32} {w.state.value:<8} task={w.task or '-'} rank={rank}"
            f" processed={w.processed} labels={labels} queues={serves}"
            f" member_of={','.join(w.member_of) or '-'} heartbeat {beat}"
        )
    return lines


def _pools(pools: Sequence[PoolRecord]) -> list[str]:
    """The worker pools (``worker --processes``): their members are among the workers."""
    if not pools:
        return []
    lines = [f"{len(pools)} pool(s)"]
    for p in pools:
        waits = (
            f" starting again in {p.backoff:.0f}s (members fail at start-up)" if p.backoff else ""
        )
        lines.append(
            f"  {p.id:<32} {len(p.members)}/{p.processes} members host={p.host} pid={p.pid}"
            f" restarts={p.restarts} (retired={p.retired} failed={p.failed})"
            f" members={','.join(p.members) or '-'}{waits}"
        )
    return lines


def _lost(lost: Sequence[LostWorker], now: float) -> list[str]:
    """The workers found dead lately: when, where, and what each of their task and queues
    reclaimed from them (``-``: not recorded, or not dropped from it yet)."""
    if not lost:
        return []
    lines = [f"{len(lost)} lost worker(s) in the last {int(WINDOW // 60)} min"]
    for w in lost:
        beat = f"{now - w.last_heartbeat:.1f}s ago" if w.last_heartbeat is not None else "-"
        reclaims = " ".join(
            f"{c.task}@{c.epoch if c.epoch is not None else '-'}="
            f"{c.reclaimed if c.reclaimed is not None else '-'}"
            for c in w.reclaims
        )
        lines.append(
            f"  {w.id:<32} lost     {now - w.lost_at:.1f}s ago host={w.host or '-'}"
            f" pid={w.pid if w.pid is not None else '-'} task={w.task or '-'}"
            f" member_of={','.join(w.member_of) or '-'} last heartbeat {beat}"
            f" reclaimed={reclaims or '-'}"
        )
    return lines


@click.command(short_help="Tasks, queues (backlog, node sets) and workers.")
@common
@option("--watch", is_flag=True, help="redraw every --interval seconds until Ctrl-C (or SIGTERM)")
@option(
    "--interval",
    type=seconds(0, 3600, above=True),
    default=1.0,
    show_default=True,
    help="seconds between redraws",
)
@option("--json", "as_json", is_flag=True, help="machine-readable output")
@option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="how many of the newest tasks to show",
)
@option(
    "--offset",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="skip this many of the newest tasks first",
)
def info(
    watch: bool, interval: float, as_json: bool, limit: int, offset: int, **flags: Any
) -> None:
    """Tasks (the newest, a page at a time: state, progress, node set with ranks), queues
    (backlog, rate, node set) and workers, like `rq info`."""
    settings = settings_from_flags(**flags)
    client = client_for(settings)
    if not watch:
        click.echo(render(client, as_json=as_json, limit=limit, offset=offset))
        return
    _end_watch_on_signals()
    try:
        while True:
            text = render(client, as_json=as_json, limit=limit, offset=offset)
            click.clear()
            click.echo(text)
            time.sleep(interval)
    except KeyboardInterrupt:  # Ctrl-C, SIGINT or SIGTERM, wherever the redraw was
        return


def _end_watch_on_signals() -> None:
    """SIGINT and SIGTERM end ``info --watch`` (exit 0). Set here, not left to Python: a
    process started with SIGINT ignored (``cmd &`` in a script) keeps it ignored, and the
    watch would redraw forever."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
