"""Shared bench plumbing: a private server, real worker/controller processes, percentiles."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from queueworks.contrib.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent


class Procs:
    def __init__(self, url: str, prefix: str, extra_env: dict[str, str] | None = None) -> None:
        self.url, self.prefix = url, prefix
        self.env = {
            **os.environ,
            "QUEUEWORKS_REDIS_URL": url,
            "QUEUEWORKS_PREFIX": prefix,
            "QUEUEWORKS_LOG_LEVEL": "warning",
            "PYTHONPATH": str(ROOT),
            **(extra_env or {}),
        }
        self.all: list[subprocess.Popen[bytes]] = []

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            [sys.executable, "-m", "queueworks", *args],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.all.append(p)
        return p

    def worker(self, name: str | None = None, *extra: str) -> subprocess.Popen[bytes]:
        name = name or f"w-{uuid.uuid4().hex[:6]}"
        return self.spawn(
            "worker",
            "--name",
            name,
            "--allow",
            "tests.handlers",
            "--allow",
            "queueworks.examples",
            *extra,
        )

    def stop_all(self) -> None:
        for p in self.all:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.all:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@contextmanager
def private_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        server.start()
        yield server


def wait_for(pred: Callable[[], Any], timeout: float, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError("bench: condition not met in time")
        time.sleep(interval)


def wait_workers(r: redis.Redis, prefix: str, n: int) -> None:
    wait_for(lambda: r.zcard(f"{prefix}:workers") >= n, 30)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]
