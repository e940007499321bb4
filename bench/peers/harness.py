"""The five workloads, written once against ``Peer`` (standard library + redis-py only).

A ``Peer`` starts its system's worker processes (each in its own session, so a SIGKILL of
the group takes the worker with its pool children, as when its container dies), enqueues
the three kinds of job from ``bench.peers.jobs`` with its own API, and says how many jobs
are still unfinished by reading its own keys in Redis. The workloads time the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis

from bench.peers.jobs import LAT_KEY, READY_KEY, RUNS_KEY, STARTS_KEY

ROOT = Path(__file__).resolve().parents[2]
EACH_CHUNK = 100  # one-call-per-job enqueueing looks at the clock between these


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.005) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout:.0f} s")
        time.sleep(interval)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def cpu_seconds(peer: Peer) -> dict[str, float]:
    """CPU time used so far: by this process (the producer, and its polling of
    ``remaining``), by the peer's worker processes (with their threads; a queueworks
    controller counts here too), and by redis-server."""
    me = os.times()
    workers = 0.0
    for proc in peer.procs:
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        workers += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    info = peer.r.info("cpu")
    return {
        "producer": me.user + me.system,
        "workers": workers,
        "redis": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
    }


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


class Peer:
    """One system under test, bound to one private Redis. Subclasses fill in the hooks."""

    name = "peer"

    def __init__(self, url: str, logdir: Path, variant: str | None = None) -> None:
        self.url, self.variant = url, variant
        self.logdir = logdir
        self.r = redis.Redis.from_url(url, socket_timeout=60)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.concurrency: int | None = None  # jobs in flight per worker process, if set
        self.counting = False  # async jobs say they ran (jobs.acount), else no-ops (anoop)

    # -- hooks ---------------------------------------------------------------------------

    def start_workers(self, n: int, *, separate: bool) -> None:
        """``n`` job-running processes; ``separate``: as ``n`` independent worker instances."""
        raise NotImplementedError

    def ready(self) -> int:
        """How many worker processes have booted (default: marks pushed by a boot hook)."""
        return int(self.r.llen(READY_KEY))

    def prepare(self) -> None:
        """Open connections and load scripts before anything is timed."""

    def enqueue_noop(self, n: int) -> None:
        """``n`` no-op jobs, with the system's bulk API where it has one."""
        raise NotImplementedError

    def enqueue_each(self, n: int) -> None:
        """``n`` no-op jobs, one enqueue call per job, each call returning before the next
        (as jobs come from a web request or a message handler)."""
        raise NotImplementedError

    def enqueue_async(self, n: int, producers: int, deadline: float) -> int:
        """Up to ``n`` async no-op jobs, each by one awaited call of the system's asyncio
        client, from ``producers`` coroutines (``produce``); none started after
        ``deadline`` (``time.perf_counter``). Returns how many were enqueued."""
        raise NotImplementedError

    def remaining(self) -> int:
        """Jobs enqueued and not yet finished."""
        raise NotImplementedError

    def enqueue_stamp(self, sent: float) -> None:
        raise NotImplementedError

    def enqueue_hold(self, seconds: float) -> None:
        raise NotImplementedError

    def job_state(self) -> str:
        """Where the hold job is, in the peer's own words, when the recovery test gives up."""
        raise NotImplementedError

    def close(self) -> None:
        self.r.close()

    # -- processes -----------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH")
        return {
            **os.environ,
            "BENCH_REDIS_URL": self.url,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
            "PYTHONUNBUFFERED": "1",
            **({"BENCH_CONCURRENCY": str(self.concurrency)} if self.concurrency else {}),
        }

    def spawn(self, argv: list[str], label: str, env: dict[str, str] | None = None) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        with open(self.logdir / f"{self.name}-{label}.log", "ab") as log:
            proc = subprocess.Popen(
                argv,
                env=env or self.env(),
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killpg takes its children too
            )
        self.procs.append(proc)

    def stop_workers(self, grace: float = 10.0) -> None:
        for proc in self.procs:
            _killpg(proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            _killpg(proc.pid, signal.SIGKILL)  # leftovers of the group (pool children)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.procs = []

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name}: a worker process exited with code {proc.returncode}"
                    f" (see {self.logdir})"
                )


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _alive_and(peer: Peer, pred: Callable[[], bool]) -> Callable[[], bool]:
    """``pred``, failing fast (instead of timing out) when a worker process has died."""

    def check() -> bool:
        peer.check_alive()
        return pred()

    return check


def boot(peer: Peer, workers: int, *, separate: bool, warm_jobs: int) -> None:
    peer.start_workers(workers, separate=separate)
    ready = _alive_and(peer, lambda: peer.ready() >= workers)
    wait_until(ready, 120, "workers ready", 0.05)
    peer.prepare()
    if warm_jobs:
        peer.enqueue_noop(warm_jobs)
        wait_until(_alive_and(peer, lambda: peer.remaining() <= 0), 60, "warm-up jobs", 0.01)


async def produce(
    n: int, producers: int, deadline: float, call: Callable[[int], Awaitable[Any]]
) -> int:
    """``call(i)`` for i in range(n), from ``producers`` coroutines, each awaiting one call
    before it makes the next (as concurrent requests of a web app each enqueue one job); no
    call starts after ``deadline``. Returns how many calls were made."""
    numbers = iter(range(n))
    sent = 0

    async def producer() -> None:
        nonlocal sent
        for i in numbers:  # shared: each number is taken by one producer
            if time.perf_counter() > deadline:
                return
            await call(i)
            sent += 1

    await asyncio.gather(*(producer() for _ in range(producers)))
    return sent


# -- the workloads -----------------------------------------------------------------------


def throughput(
    peer: Peer, n: int, workers: int, budget: float = 900.0, each: bool = False
) -> dict[str, Any]:
    """Workers booted and warm; clock from the first enqueue call to the last job done.
    ``each``: one enqueue call per job (``enqueue_each``, in chunks of ``EACH_CHUNK``
    calls), else the bulk API.

    A system that has not finished within ``budget`` seconds is stopped there: its rate is
    the jobs done by then over the time taken (``capped``); with ``each``, it also stops
    enqueueing there (``jobs`` is then what it enqueued)."""
    try:
        boot(peer, workers, separate=False, warm_jobs=4 * workers)
        t0 = time.perf_counter()
        sent = 0
        if not each:
            peer.enqueue_noop(n)
            sent = n
        while each and sent < n and time.perf_counter() - t0 < budget:
            chunk = min(EACH_CHUNK, n - sent)
            peer.enqueue_each(chunk)
            sent += chunk
        t_enqueued = time.perf_counter()
        while (left := peer.remaining()) > 0 and time.perf_counter() - t0 < budget:
            time.sleep(0.005)
        seconds = time.perf_counter() - t0
        peer.check_alive()
    finally:
        peer.stop_workers()
    done = sent - max(0, left)
    return {
        "jobs": sent,
        "done": done,
        "capped": left > 0 or sent < n,
        "workers": workers,
        "each": each,
        "seconds": seconds,
        "enqueue_seconds": t_enqueued - t0,
        "jobs_per_s": done / seconds,
    }


def async_throughput(
    peer: Peer,
    n: int,
    workers: int,
    concurrency: int,
    producers: int,
    budget: float = 900.0,
    count: bool = False,
) -> dict[str, Any]:
    """asyncio on both sides: ``workers`` processes running ``async def`` no-ops with
    ``concurrency`` jobs in flight each; ``n`` jobs, each by one awaited enqueue call from
    ``producers`` coroutines (``Peer.enqueue_async``). Workers booted and warm; clock from
    the first enqueue call to the last job done, capped at ``budget`` as ``throughput``.
    ``count``: each job records that it ran (``jobs.acount``), and ``runs`` says how many
    jobs ran once, more than once, or not at all."""
    peer.concurrency, peer.counting = concurrency, count
    try:
        boot(peer, workers, separate=False, warm_jobs=0)
        peer.enqueue_async(4 * workers * concurrency, producers, math.inf)  # warm the path
        wait_until(_alive_and(peer, lambda: peer.remaining() <= 0), 60, "warm-up jobs", 0.01)
        peer.r.delete(RUNS_KEY)
        cpu0 = cpu_seconds(peer)
        t0 = time.perf_counter()
        sent = peer.enqueue_async(n, producers, t0 + budget)
        t_enqueued = time.perf_counter()
        while (left := peer.remaining()) > 0 and time.perf_counter() - t0 < budget:
            time.sleep(0.005)
        seconds = time.perf_counter() - t0
        cpu = {k: v - cpu0[k] for k, v in cpu_seconds(peer).items()}
        peer.check_alive()
    finally:
        peer.stop_workers()
    done = sent - max(0, left)
    result = {
        "jobs": sent,
        "done": done,
        "capped": left > 0 or sent < n,
        "workers": workers,
        "concurrency": concurrency,
        "producers": producers,
        "seconds": seconds,
        "enqueue_seconds": t_enqueued - t0,
        "jobs_per_s": done / seconds,
        "cpu_seconds": cpu,
    }
    if count:
        runs = [int(v) for v in peer.r.hvals(RUNS_KEY)]
        once = sum(1 for v in runs if v == 1)
        result["runs"] = {"once": once, "more": len(runs) - once, "never": sent - len(runs)}
    return result


def enqueue(peer: Peer, n: int) -> dict[str, Any]:
    """No workers: the producer's rate, and what the queued jobs cost Redis in memory."""
    peer.prepare()
    before = used_memory(peer.r)
    t0 = time.perf_counter()
    peer.enqueue_noop(n)
    seconds = time.perf_counter() - t0
    time.sleep(0.2)  # let lazy frees settle before reading memory
    after = used_memory(peer.r)
    queued = peer.remaining()
    return {
        "jobs": n,
        "seconds": seconds,
        "jobs_per_s": n / seconds,
        "queued": queued,
        "memory_bytes": after - before,
        "bytes_per_job": (after - before) / n,
        "mb_per_100k": (after - before) / n * 100_000 / 1e6,
    }


def latency(peer: Peer, rate: float, count: int, workers: int) -> dict[str, Any]:
    """One job every 1/rate s from one producer; a sample is handler start - send time."""
    try:
        boot(peer, workers, separate=False, warm_jobs=2 * workers)
        for _ in range(5):  # warm the stamp path (imports, first connections)
            peer.enqueue_stamp(time.time())
        wait_until(lambda: peer.r.llen(LAT_KEY) >= 5, 60, "warm-up stamps", 0.01)
        peer.r.delete(LAT_KEY)
        interval, late = 1.0 / rate, 0
        t_next = time.monotonic()
        for _ in range(count):
            t_next += interval
            pause = t_next - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                late += 1
            peer.enqueue_stamp(time.time())
        wait_until(lambda: peer.r.llen(LAT_KEY) >= count, 120, f"{count} stamps", 0.01)
    finally:
        peer.stop_workers()
    ms = [float(v) * 1000 for v in peer.r.lrange(LAT_KEY, 0, -1)]
    return {
        "rate": rate,
        "jobs": count,
        "workers": workers,
        "late_sends": late,
        "p50_ms": pct(ms, 50),
        "p90_ms": pct(ms, 90),
        "p99_ms": pct(ms, 99),
        "max_ms": max(ms),
    }


def _starts(peer: Peer) -> list[dict[str, Any]]:
    return [json.loads(v) for v in peer.r.lrange(STARTS_KEY, 0, -1)]


def recovery(peer: Peer, give_up: float) -> dict[str, Any]:
    """Two independent workers; SIGKILL the one running the hold job (its whole process
    group, and the job's own group where the job runs in a separate session); time until the
    job starts again anywhere, or give up and say where the job is."""
    try:
        boot(peer, 2, separate=True, warm_jobs=4)
        peer.enqueue_hold(give_up + 600)
        wait_until(lambda: _starts(peer), 60, "hold job started", 0.01)
        # A start may be repeated while the system settles (queueworks suspends a step when
        # the second member joins): wait until the record is stable, then take the holder.
        n_before = 0
        while len(starts := _starts(peer)) != n_before:
            n_before = len(starts)
            time.sleep(1.5)
        holder = starts[-1]
        victim = next(
            (p for p in peer.procs if p.pid in (holder["pgid"], holder["ppid"], holder["pid"])),
            None,
        )
        if victim is None:
            raise RuntimeError(f"no worker process holds pid {holder['pid']}")
        t_kill = time.time()
        _killpg(holder["pgid"], signal.SIGKILL)
        _killpg(victim.pid, signal.SIGKILL)

        def rerun() -> dict[str, Any] | None:
            later = [s for s in _starts(peer) if s["t"] > t_kill]
            return later[0] if later else None

        try:
            again = wait_until(rerun, give_up, "re-run", 0.02)
        except TimeoutError:
            again = None
        state = peer.job_state()
    finally:
        peer.stop_workers(grace=0)
    if again is None:
        return {"recovered": False, "gave_up_after_s": give_up, "state": state}
    return {"recovered": True, "seconds": again["t"] - t_kill, "state": state}


WORKLOADS: dict[str, Callable[..., dict[str, Any]]] = {
    "throughput": throughput,
    "async_throughput": async_throughput,
    "enqueue": enqueue,
    "latency": latency,
    "recovery": recovery,
}
