"""Fixtures: a private Redis server per session, a key prefix per test, and factories for
real worker and controller processes that are always stopped (SIGKILL as the last resort).
Those processes are forked from one that imported queueworks already (``tests/forkserver.py``:
a fresh interpreter spends ~0.5 CPU-s importing it, and the suite starts hundreds);
``QUEUEWORKS_TEST_FORK=0`` starts each with ``python -m queueworks`` instead.

``QUEUEWORKS_TEST_REDIS_URL`` runs the suite against an external server instead.

Optional pieces (torch, chromium, docker-compose, a redis-server with TLS, redis-cli) go
through ``need_program`` / ``need_module`` / ``need_packages``: where one is missing, the
test is skipped with the command that installs it, except under
``QUEUEWORKS_REQUIRE_ALL=1`` (set by ``.ci/run``), where it fails: CI runs every test.

Every test is marked with its kind, exactly one of (registered in pyproject.toml):

* ``unit``: no Redis, no process -- pure Python;
* ``integration``: real Redis servers (private ones the tests start: a server, a
  sentinel set, a Redis Cluster), the code under test in the test's own process;
* ``system``: starts queueworks processes (worker, controller, dashboard, the CLI, a
  benchmark, ``python -c``), rq workers, a browser or Docker.

A file of one kind says so once (``pytestmark = pytest.mark.integration``); a file of
several marks each test. ``slow(seconds)`` (besides the kind) marks the few tests of
tens of seconds, with about how long each takes here alone: they are started first,
longest first. Collection fails on a test without exactly one kind, or whose fixtures
contradict it (``cluster`` outside ``system``, Redis in ``unit``).

The suite runs on xdist workers unless told otherwise (``pytest_cmdline_main`` below:
``-n 0`` or ``-p no:xdist`` runs it in one process, ``-n N`` on N workers); each worker
starts its own private Redis server.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest
import redis

from queueworks import Client
from queueworks.contrib.redis_server import RedisServer
from queueworks.protocol.keys import Keys
from tests import forkserver

ROOT = Path(__file__).resolve().parent.parent

REQUIRE_ALL = "QUEUEWORKS_REQUIRE_ALL"
TORCH_INSTALL = (
    "pip install -e '.[torch]' --extra-index-url https://download.pytorch.org/whl/cpu"
    " (the CPU build)"
)
REDIS_INSTALL = "apt-get install redis-server (brings redis-cli; has TLS)"


def require_all() -> bool:
    """True where every test must run (CI): a missing optional piece is then a failure."""
    return os.environ.get(REQUIRE_ALL, "") not in ("", "0")


def missing(what: str, install: str) -> NoReturn:
    """Skip for lack of ``what`` (saying how to install it), or fail under REQUIRE_ALL."""
    message = f"{what} is not installed: {install}"
    if require_all():
        pytest.fail(f"{message} ({REQUIRE_ALL}=1: every test must run)", pytrace=False)
    pytest.skip(message, allow_module_level=True)


# How long a test waits for a piece that CI sets up beside the tests (``await_setup``)
SETUP_WAIT = 900.0


def await_setup(name: str) -> None:
    """Wait until the piece ``name`` that CI sets up in the background, beside the tests,
    is over (``.ci/run``: ``docker-engine``, ``wheelhouse``, ``peer-venvs``), whatever its
    outcome: the test then finds it there or fails as without it. Elsewhere (no
    ``QUEUEWORKS_CI_SETUP``) nothing is set up beside the tests: it returns at once."""
    folder = os.environ.get("QUEUEWORKS_CI_SETUP")
    if not folder:
        return
    marker = Path(folder) / name
    deadline = time.monotonic() + SETUP_WAIT
    while not marker.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"CI's set-up of {name} did not end in {SETUP_WAIT:.0f} s", pytrace=False)
        time.sleep(0.5)


def need_program(name: str, install: str) -> str:
    """The path of program ``name`` on PATH, else skip / fail (see ``missing``)."""
    return shutil.which(name) or missing(name, install)


def need_packages(*names: str, install: str) -> None:
    """Skip / fail (see ``missing``) unless every package is installed; found, not imported
    (a module-level check costs the collection nothing: torch takes seconds to import, in
    every xdist worker). Works at module level."""
    for package in names:
        if importlib.util.find_spec(package) is None:
            missing(f"the Python package {package!r}", install)


def need_module(name: str, install: str, *, needs: tuple[str, ...] = ()) -> ModuleType:
    """Module ``name`` imported, else skip / fail (see ``missing``). Works at module level.
    ``needs``: packages it must find beside it (torch warns, an error here, without numpy).
    Only an absent package is an absence: one that is there and fails to import raises."""
    need_packages(name, *needs, install=install)
    return importlib.import_module(name)


# Examples per property test (hypothesis): enough to find what the suite's tests have found
# so far in every run; QUEUEWORKS_EXAMPLES=1000 searches deeper (minutes more).
EXAMPLES = int(os.environ.get("QUEUEWORKS_EXAMPLES", "100"))

KINDS = ("unit", "integration", "system")
REDIS_FIXTURES = {"redis_url", "r", "client"}
# Most tests wait (heartbeat TTLs, processes starting, Redis restarts), so the suite runs
# on more workers than this 2-core machine has cores.
XDIST_WORKERS = 8


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``python -m pytest`` runs on ``XDIST_WORKERS`` xdist workers, handing them one test
    at a time (``--dist loadgroup --maxschedchunk 1``: tests marked with one
    ``xdist_group`` run one after the other, on one worker), unless told how many (``-n``,
    ``-n 0``), without xdist (``-p no:xdist``), under ``--pdb``, or with ``-s`` (output shown: the
    tests' prints, such as their FIGURE lines, reach the terminal from one process only)."""
    option = config.option
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    if option.numprocesses is not None or option.usepdb or option.collectonly:
        return
    if option.capture == "no":
        return
    option.numprocesses = XDIST_WORKERS
    if option.dist == "no":  # loadgroup: ``load``, but a group's tests share one worker
        option.dist = "loadgroup"
        option.maxschedchunk = option.maxschedchunk or 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = [f"{item.nodeid}: {why}" for item in items if (why := kind_problem(item))]
    if problems:
        raise pytest.UsageError(
            "every test needs exactly one kind marker, consistent with its fixtures "
            "(see tests/conftest.py):\n  " + "\n  ".join(problems)
        )
    if hasattr(config, "workerinput"):
        items[:] = slow_first(items)


def kind_problem(item: pytest.Item) -> str | None:
    kinds = sorted({m.name for m in item.iter_markers() if m.name in KINDS})
    if not kinds:
        return (
            "no kind: mark it (or its module: pytestmark = pytest.mark.KIND) unit, "
            "integration or system"
        )
    if len(kinds) > 1:
        return f"kinds {', '.join(kinds)}: one only"
    fixtures = set(getattr(item, "fixturenames", ()))
    if "cluster" in fixtures and kinds != ["system"]:
        return f"marked {kinds[0]}, but the cluster fixture starts processes: system"
    if fixtures & REDIS_FIXTURES and kinds == ["unit"]:
        return f"marked unit, but uses Redis ({', '.join(sorted(fixtures & REDIS_FIXTURES))})"
    return None


def slow_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The ``slow`` tests first, longest first (``slow(seconds)``), each followed by a
    quick one: xdist's load scheduler gives each worker two tests to begin with (it runs
    one and keeps the next), so each of the first workers starts on a slow test, with a
    quick one after it, and the other slow tests are the next ones handed out. The long
    poles then overlap instead of ending the run one after another."""

    def seconds(item: pytest.Item) -> float:
        mark = item.get_closest_marker("slow")
        return float(mark.args[0]) if mark is not None and mark.args else 0.0

    slow = sorted(
        (item for item in items if item.get_closest_marker("slow")), key=seconds, reverse=True
    )
    quick = [item for item in items if not item.get_closest_marker("slow")]
    head = [x for pair in zip(slow, quick, strict=False) for x in pair]
    return head + slow[len(quick) :] + quick[len(slow) :]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("QUEUEWORKS_TEST_REDIS_URL")
    if external:
        yield external
        return
    with RedisServer() as server:
        server.start()
        yield server.url


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url, socket_timeout=10)
    yield conn
    conn.close()


@pytest.fixture
def keys(prefix: str) -> Keys:
    return Keys(prefix)


@pytest.fixture
def client(redis_url: str, prefix: str) -> Iterator[Client]:
    c = Client.from_url(redis_url, prefix=prefix)
    yield c
    c.close()


class Proc:
    """A real queueworks process (``python -m queueworks ...``) with its log file, forked
    from a process that imported queueworks already (``tests/forkserver.py``)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.log_path = args, log
        self._log = log.open("ab")
        self.p: subprocess.Popen[bytes] | forkserver.ForkedProcess
        if forkserver.enabled():
            self.p = forkserver.start(args, env, log)
        else:
            self.p = subprocess.Popen(
                [sys.executable, "-m", "queueworks", *args],
                env=env,
                cwd=ROOT,
                stdout=self._log,
                stderr=self._log,
            )
        self.name = ""

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.p.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.p.wait()

    def terminate(self, timeout: float = 20.0) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.alive():
            self.kill()
        self._log.close()


class Cluster:
    """Factory of worker/controller processes for one test (one key prefix)."""

    def __init__(self, redis_url: str, prefix: str, tmp: Path) -> None:
        self.redis_url, self.prefix, self.tmp = redis_url, prefix, tmp
        self.procs: list[Proc] = []
        self.env = {
            **os.environ,
            "QUEUEWORKS_REDIS_URL": redis_url,
            "QUEUEWORKS_PREFIX": prefix,
            "QUEUEWORKS_LOG_FORMAT": "json",
            "PYTHONPATH": str(ROOT),
        }

    def spawn(self, args: list[str], name: str, env: dict[str, str] | None = None) -> Proc:
        proc = Proc(args, {**self.env, **(env or {})}, self.tmp / f"{name}.log")
        proc.name = name
        self.procs.append(proc)
        return proc

    def worker(
        self,
        name: str | None = None,
        *,
        allow: tuple[str, ...] = ("tests.handlers", "queueworks.examples"),
        labels: dict[str, str] | None = None,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> Proc:
        name = name or f"w{len(self.procs)}-{uuid.uuid4().hex[:4]}"
        args = ["worker", "--name", name]
        for a in allow:
            args += ["--allow", a]
        for k, v in (labels or {}).items():
            args += ["--label", f"{k}={v}"]
        return self.spawn(args + (extra or []), name, env)

    def controller(self, name: str | None = None, extra: list[str] | None = None) -> Proc:
        name = name or f"c{len(self.procs)}"
        return self.spawn(["controller", *(extra or [])], name)

    def wait_workers(self, r: redis.Redis, n: int, timeout: float = 60.0) -> None:
        """Until ``n`` workers registered (processes start in seconds on a loaded machine)."""
        keys = Keys(self.prefix)
        wait_for(lambda: r.zcard(keys.workers) >= n, timeout, f"{n} workers registered")

    def wait_leader(self, r: redis.Redis, timeout: float = 30.0) -> None:
        """Until some controller holds the leader lease (what commands call "running")."""
        keys = Keys(self.prefix)
        wait_for(lambda: r.exists(keys.leader), timeout, "a controller holding the lease")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log()[-4000:]}" for p in self.procs)

    def close(self) -> None:
        for p in self.procs:
            if p.alive():
                p.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.p.wait(max(0.1, deadline - time.monotonic()))
            p.close()


@pytest.fixture
def cluster(
    redis_url: str, prefix: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    c = Cluster(redis_url, prefix, tmp_path)
    yield c
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(c.logs())
    c.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    forkserver.stop()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{rep.when}", rep)


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
