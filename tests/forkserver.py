"""Start ``python -m queueworks ARGS`` processes by forking one that imported queueworks
already: the tests start hundreds of workers and controllers, and each fresh interpreter
spends most of its start-up CPU (~0.5 s) importing queueworks and its dependencies.

A ``ForkServer`` is a plain ``python`` process (one per test process, started on first
use) that imports the CLI and the worker and controller modules once, then waits for
requests on its stdin. For each one it forks a child that becomes what ``python -m
queueworks ARGS`` would be: its own environment, ``sys.path`` from its ``PYTHONPATH``,
its working directory, stdin from /dev/null, stdout and stderr to its log file (buffered
as its environment says), default signal handlers, and ``queueworks.__main__`` run as
``__main__``. It exits as a fresh interpreter would (``sys.exit``, an uncaught exception,
a signal). The server reaps its children and reports each exit status, so a
``ForkedProcess`` answers ``poll``/``wait``/``returncode`` as ``subprocess.Popen`` does;
signals go straight to the child's PID. The server holds no threads when it forks.

What is not the same as a fresh process: modules the server imported were imported with
the server's environment (queueworks reads its settings when an entry point runs, never
at import), and the children share the server's hash seed. ``QUEUEWORKS_TEST_FORK=0``
starts every process with ``python -m queueworks`` instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# the server's program: run with ``python -c``; the request and report protocol is one JSON
# object per line (request: n, args, env, cwd, log; replies: {"pid": p}, and later
# {"exit": n, "rc": r} when it ended)
SERVER = r"""
import io, json, os, runpy, select, signal, sys

import queueworks.cli, queueworks.workers.worker, queueworks.controller.main  # shared

BASE_PATH = [p for p in sys.path if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)
inbox, out = sys.stdin.buffer, sys.stdout


def report(msg):
    out.write(json.dumps(msg) + "\n")
    out.flush()


def stdio(fd, unbuffered, stderr):
    raw = io.FileIO(fd, "w", closefd=False)
    buf = raw if unbuffered else io.BufferedWriter(raw)
    errors = "backslashreplace" if stderr else None
    return io.TextIOWrapper(buf, errors=errors, line_buffering=stderr, write_through=unbuffered)


def become(req):
    # in the child: what `python -m queueworks ARGS` would be, then run it
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for fd in (log, null, wake_r, wake_w):
        os.close(fd)
    env = req["env"]
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [req["cwd"], *extra, *BASE_PATH[1:]]
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdout = sys.__stdout__ = stdio(1, unbuffered, False)
    sys.stderr = sys.__stderr__ = stdio(2, unbuffered, True)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.argv = ["-m", *req["args"]]
    runpy.run_module("queueworks", run_name="__main__", alter_sys=True)


def main():
    children = {}  # pid -> the request's number (pids are reused, numbers are not)
    while True:
        ready, _, _ = select.select([inbox, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            n = children.pop(pid)
            report({"exit": n, "rc": os.waitstatus_to_exitcode(status)})
        if inbox in ready:
            line = inbox.readline()
            if not line:
                return None  # the test process is gone
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return req
            children[pid] = req["n"]
            report({"pid": pid})


child = main()
if child is not None:
    become(child)  # exits as `python -m queueworks` would: its SystemExit or exception
"""


class ForkedProcess:
    """A child of the fork server, with the parts of ``subprocess.Popen`` tests use."""

    def __init__(self, server: ForkServer, n: int, pid: int, args: list[str]) -> None:
        self._server, self._n, self.pid, self.args = server, n, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self._n)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._server.changed:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
                self._server.changed.wait(left)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(9)


class ForkServer:
    """One fork server process and the thread that reads its replies."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        self.changed = threading.Condition()
        self._pids: list[int] = []
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()  # one request at a time: replies come in order
        self._sent = 0
        threading.Thread(target=self._read, name="fork-server", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg: dict[str, Any] = json.loads(line)
            with self.changed:
                if "pid" in msg:
                    self._pids.append(int(msg["pid"]))
                else:
                    self._exits[int(msg["exit"])] = int(msg["rc"])
                self.changed.notify_all()
        with self.changed:
            self._pids.append(-1)  # the server ended: no more replies
            self.changed.notify_all()

    def exit_code(self, n: int) -> int | None:
        """Child ``n``'s exit status, once it ended (kept: any thread may ask again)."""
        with self.changed:
            return self._exits.get(n)

    def start(self, args: list[str], env: dict[str, str], log: Path) -> ForkedProcess:
        assert self.proc.stdin is not None
        with self._lock:
            self._sent += 1
            n = self._sent
            req = {"n": n, "args": args, "env": env, "cwd": str(ROOT), "log": str(log)}
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            with self.changed:
                ok = self.changed.wait_for(lambda: self._pids, 60)
                assert ok, "the fork server did not answer in 60 s"
                pid = self._pids.pop(0)
        assert pid > 0, f"the fork server ended (exit {self.proc.poll()})"
        return ForkedProcess(self, n, pid, args)


_server: ForkServer | None = None
_server_lock = threading.Lock()


def stop() -> None:
    """End the fork server (its children run on) and reap it."""
    with _server_lock:
        if _server is not None and _server.proc.stdin is not None:
            _server.proc.stdin.close()
            _server.proc.wait(30)


def enabled() -> bool:
    return os.environ.get("QUEUEWORKS_TEST_FORK", "1") != "0"


def start(args: list[str], env: dict[str, str], log: Path) -> ForkedProcess:
    """``python -m queueworks ARGS`` with ``env``, output appended to ``log``."""
    global _server
    with _server_lock:
        if _server is None or _server.proc.poll() is not None:
            _server = ForkServer()
        server = _server
    return server.start(args, env, log)
