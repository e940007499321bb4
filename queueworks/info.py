"""``queueworks info``: tasks and workers as text (or JSON), like ``rq info``."""

from __future__ import annotations

import json
import time

from queueworks.client import Client


def _bar(fraction: float, width: int = 20) -> str:
    filled = round(fraction * width)
    return "#" * filled + "." * (width - filled)


def render(client: Client, *, as_json: bool = False, limit: int = 100, offset: int = 0) -> str:
    """The ``limit`` newest tasks after ``offset`` (a page of the index), then the workers."""
    tasks = client.tasks(limit=limit, offset=offset, newest_first=True)
    tasks.sort(key=lambda t: t.created_at)
    total = client.task_count()
    workers = client.workers()
    if as_json:
        return json.dumps(
            {
                "total": total,
                "offset": offset,
                "tasks": [t.model_dump(mode="json") for t in tasks],
                "workers": [w.model_dump(mode="json") for w in workers],
            },
            indent=2,
        )
    now = time.time()
    shown = f" (the {len(tasks)} newest after {offset})" if len(tasks) < total else ""
    lines = [f"{total} task(s){shown}"]
    for t in tasks:
        nodes = client.task(t.id).status().nodes if not t.finished else []
        size = f"{len(nodes)}/{t.min_nodes}/{t.max_nodes if t.max_nodes else '-'}"
        lines.append(
            f"  {t.id}  {t.name[:24]:<24} {t.state.value:<9} p={t.priority:<3} "
            f"[{_bar(t.progress)}] {t.done + t.dead}/{t.total} dead={t.dead} "
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
