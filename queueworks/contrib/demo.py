"""``queueworks demo``: the whole system on one machine, started and stopped in one command."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from typing import Any

import redis

from queueworks.client.sync import Client, Task
from queueworks.protocol.models import TaskSpec, TaskStatus
from queueworks.settings import Settings
from queueworks.transport.connection import connect, redact_url


def _reachable(url: str) -> bool:
    try:
        connect(url, socket_timeout=0.5).ping()  # any URL connect() takes (cluster, sentinel)
        return True
    except (redis.RedisError, OSError, ValueError):
        return False


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "queueworks", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C reaches us; we stop the children in order
    )


def _largest_node_set(client: Client, task_id: str) -> int:
    """From the task's history: every join records the node set's size after it."""
    entries: Any = client.redis.xrange(client.keys.task(task_id).history)
    return max((int(f[b"size"]) for _, f in entries if b"size" in f), default=0)


def _follow(task: Task, deadline: float) -> TaskStatus | None:
    """Draw the progress bar until the task finishes (its status), or None at ``deadline``."""
    while True:
        status = task.status()
        frac = status.progress
        bar = "#" * int(frac * 40) + "." * (40 - int(frac * 40))
        nodes = "released" if status.finished else str(len(status.nodes))
        print(
            f"\r[{bar}] {status.done + status.dead}/{status.total} {status.state.value:<9}"
            f" node set={nodes} epoch={status.epoch}  ",
            end="",
            flush=True,
        )
        if status.finished:
            return status
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def run_demo(*, n_workers: int, subtasks: int, embedded: bool, redis_url: str | None) -> int:
    from queueworks.contrib.redis_server import RedisServer

    url = redis_url or Settings().redis_url
    server: RedisServer | None = None
    procs: list[subprocess.Popen[bytes]] = []
    prefix = f"demo-{secrets.token_hex(6)}"  # a namespace of its own in a borrowed Redis
    try:
        if embedded or not _reachable(url):
            server = RedisServer(notify_keyspace_events="K$gx").start()
            url = server.url
            print(f"started an embedded Redis-compatible server: {server.binary} on {url}")
        else:
            print(
                f"using Redis at {redact_url(url)}: keys under prefix {prefix}, "
                "deleted when the demo ends"
            )
        env = {**os.environ, "QUEUEWORKS_REDIS_URL": url, "QUEUEWORKS_PREFIX": prefix}
        env["QUEUEWORKS_LOG_LEVEL"] = "warning"
        procs.append(_spawn(["controller"], env))
        procs += [
            _spawn(["worker", "--allow", "queueworks.examples"], env) for _ in range(n_workers)
        ]
        client = Client.from_url(url, prefix=prefix)
        started = time.monotonic()
        task = client.submit(
            TaskSpec(
                name="demo-digest",
                handler="queueworks.examples:digest",
                subtasks=({"x": i, "rounds": 50} for i in range(subtasks)),
                min_nodes=1,
            )
        )
        print(f"submitted task {task.id}: {subtasks} subtasks, {n_workers} workers")
        status = _follow(task, deadline=started + 300)
        if status is None:
            print("\ndemo: gave up after 300 s")
            return 1
        seconds = (status.finished_at or time.time()) - (status.started_at or status.created_at)
        rate = status.total / seconds if seconds > 0 else 0.0
        results = dict(task.results())
        peak = _largest_node_set(client, task.id)  # a finished task has released its nodes
        print(
            f"\n{status.state.value}: done={status.done} dead={status.dead} "
            f"seconds={seconds:.2f} subtasks/s={rate:,.0f} results={len(results)} "
            f"largest node set={peak} of {n_workers} workers"
        )
        client.close()
        return 0 if status.done == subtasks and len(results) == subtasks else 1
    except KeyboardInterrupt:
        print("\ninterrupted; stopping everything")
        return 130
    finally:
        _stop(procs)
        if server is not None:
            server.close()
        else:
            _forget(url, prefix)


def _forget(url: str, prefix: str) -> None:
    """Delete every key of the demo's prefix from a Redis it did not start (its processes
    stopped first: nothing writes them again)."""
    try:
        r = connect(url)
        for key in r.scan_iter(match=f"{prefix}:*", count=1000):
            r.unlink(key)
        r.close()
    except (redis.RedisError, OSError) as exc:
        print(f"demo: could not delete the keys under prefix {prefix}: {exc}")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to all (a warm stop each), then wait; SIGKILL what is left after 15 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
