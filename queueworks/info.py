"""``queueworks info``: tasks and workers as text (or JSON), like ``rq info``."""

from __future__ import annotations

import json
import time

from queueworks.client import Client


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


def render(client: Client, *, as_json: bool = False) -> str:
    tasks = client.tasks()
    workers = client.workers()
    if as_json:
        return json.dumps(
            {
                "tasks": [t.model_dump(mode="json") for t in tasks],
                "workers": [w.model_dump(mode="json") for w in workers],
            },
            indent=2,
        )
    now = time.time()
    lines = [f"{len(tasks)} task(s)"]
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
        if t.reason and not t.finished:
            lines.append(f"      waiting: {t.reason}")
        for n in nodes:
            age = f"{n.heartbeat_age:.1f}s" if n.heartbeat_age is not None else "-"
            lines.append(f"      rank {n.rank}: {n.worker}  hb {age}  current={n.current or '-'}")
    lines.append(f"{len(workers)} worker(s)")
    for w in workers:
        beat = f"{now - w.last_heartbeat:.1f}s ago" if w.last_heartbeat else "-"
        labels = ",".join(f"{k}={v}" for k, v in w.labels.items()) or "-"
        rank = w.rank if w.rank is not None else "-"
        lines.append(
            f"  {w.id:<32} {w.state.value:<8} task={w.task or '-'} rank={rank}"
            f" processed={w.processed} labels={labels} heartbeat {beat}"
        )
    return "\n".join(lines)
