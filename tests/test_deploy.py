"""Issue 5: deploy as users do. compose.yaml is checked by Debian's docker-compose, and its
services' exact commands are run as processes (no Docker engine on these machines) to
reproduce ``docker compose up --scale worker=N`` while a task runs: 2 -> 6 -> 1 -> 4.

Budget: ~50 s for the whole file (the scale test is most of it).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from queueworks import Client, TaskSpec, TaskState
from queueworks.contrib.redis_server import free_port
from queueworks.protocol.keys import Keys
from tests.conftest import ROOT, Cluster, Proc, await_setup, need_program, wait_for

pytestmark = pytest.mark.system

COMPOSE = ROOT / "compose.yaml"
N_SUBTASKS = 800  # at least; more where processes start slowly (see the scale test)
WORK_PER_STARTUP = 80.0  # worker-seconds of work per second the first workers took to start
SCALE_STEPS = (6, 1, 4)  # after the compose file's own `deploy.replicas` (2)

# -- reading compose.yaml as compose does ------------------------------------------------

_VAR = re.compile(
    r"\$(?:(?P<dollar>\$)|\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_]\w*))"
)


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable substitution: ``$$``, ``${V}``, ``${V:-d}``, ``${V-d}``, ``${V:?e}``."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group("dollar"):
            return "$"
        name = m.group("name") or m.group("bare")
        op, arg, got = m.group("op"), m.group("arg") or "", env.get(name)
        if op in (":-", "-"):
            return (got if got else arg) if op == ":-" else (arg if got is None else got)
        if op in (":?", "?") and (not got if op == ":?" else got is None):
            raise ValueError(f"compose.yaml requires ${name}: {arg}")
        return got or ""

    return _VAR.sub(sub, value)


def load_compose(env: Mapping[str, str]) -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the `<<: *anchor` merges
    return dict(interpolate(raw, env))


def check_autoscale(svc: dict[str, Any], worker: dict[str, Any]) -> None:
    """The autoscaler: off by default, scaling the worker service with compose (no shell),
    given the engine's socket and the compose files, over the same Redis as the rest."""
    assert svc["profiles"] == ["autoscale"]
    command = svc["command"]
    assert command[:2] == ["queueworks", "autoscale"] and "--shell" not in command
    scale = command[command.index("--scale-command") + 1]
    assert "--scale worker={n} worker" in scale and "--no-recreate" in scale
    assert int(command[command.index("--min") + 1]) == 0  # to zero when idle
    assert any(v.startswith("/var/run/docker.sock:") for v in svc["volumes"])
    assert (
        svc["environment"]["QUEUEWORKS_REDIS_URL"] == worker["environment"]["QUEUEWORKS_REDIS_URL"]
    )


def duration(text: str) -> float:
    """A compose duration (``30s``, ``1m30s``, ``500ms``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(text))
    assert parts and "".join(a + b for a, b in parts) == str(text), text
    return sum(float(n) * units[u] for n, u in parts)


# -- running a compose service as processes ----------------------------------------------


class Service:
    """One compose service run as N processes, each with its private /tmp like a container."""

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        spec: dict[str, Any],
        tmp: Path,
        ports: Mapping[int, int] | None = None,
    ) -> None:
        command = list(spec["command"])
        assert command[0] == "queueworks", command  # the image's console script
        self.cluster, self.name, self.spec, self.tmp = cluster, name, spec, tmp
        self.ports = dict(ports or {})  # container port -> host port (processes share one)
        self.args = command[1:]
        self.env = {k: str(v) for k, v in (spec.get("environment") or {}).items()}
        self.grace = duration(spec.get("stop_grace_period", "10s"))
        self.running: list[Proc] = []
        self.started = 0

    def _private(self, arg: str, replica: Path) -> str:
        """What the argument means inside this replica's "container": its own /tmp, and
        its container port mapped to the host port it got here."""
        if arg.startswith("/tmp/"):
            return str(replica / arg[len("/tmp/") :])
        for inner, outer in self.ports.items():
            if arg == str(inner):
                return str(outer)
            arg = arg.replace(f":{inner}/", f":{outer}/")
        return arg

    def _replica_tmp(self, proc: Proc) -> Path:
        return self.tmp / proc.name

    def start_one(self) -> Proc:
        self.started += 1
        name = f"{self.name}-{self.started}"  # like compose's project-service-N
        replica = self.tmp / name
        replica.mkdir(parents=True)
        args = [self._private(a, replica) for a in self.args]
        proc = self.cluster.spawn(args, name, self.env)
        self.running.append(proc)
        return proc

    def scale(self, n: int, ok: tuple[int, ...] = (0,)) -> list[tuple[Proc, float]]:
        """Start or stop replicas until n run; the surplus (last started) get SIGTERM, as docker
        does, and must exit by themselves within stop_grace_period, with a
        return code in `ok`."""
        while len(self.running) < n:
            self.start_one()
        stopping: list[tuple[Proc, float]] = []
        while len(self.running) > n:
            proc = self.running.pop()
            proc.signal(signal.SIGTERM)
            stopping.append((proc, time.time()))
        for proc, _ in stopping:
            try:
                rc = proc.p.wait(self.grace)
            except subprocess.TimeoutExpired:
                proc.kill()  # what docker does after the grace period: a failure here
                raise AssertionError(f"{proc.name} did not exit within {self.grace} s") from None
            assert rc in ok, f"{proc.name} exited {rc}:\n{proc.log()[-3000:]}"
        return stopping

    def healthcheck(self, proc: Proc) -> subprocess.CompletedProcess[str]:
        """Run the service's healthcheck command inside `proc`'s "container"."""
        test = list(self.spec["healthcheck"]["test"])
        assert test[0] == "CMD" and test[1] in ("queueworks", "python"), test
        replica = self._replica_tmp(proc)
        args = [self._private(a, replica) for a in test[2:]]
        prog = ["-m", "queueworks"] if test[1] == "queueworks" else []
        return subprocess.run(
            [sys.executable, *prog, *args],
            env={**self.cluster.env, **self.env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def worker_id(self, proc: Proc) -> str:
        """The id the worker generated, from the file its command names with --id-file."""
        path = Path(
            self._private(self.args[self.args.index("--id-file") + 1], self._replica_tmp(proc))
        )
        return str(wait_for(lambda: path.exists() and path.read_text().strip(), 15, "id file"))


# -- the compose file ----------------------------------------------------------------------


def test_docker_compose_accepts_compose_yaml() -> None:
    # it validates compose.yaml as users' compose will read it
    exe = need_program("docker-compose", "apt-get install docker-compose")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    res = subprocess.run(
        [exe, "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    # what compose resolved is what our own reading of the file resolves to
    resolved = yaml.safe_load(res.stdout)
    ours = load_compose(env)
    services = resolved["services"]
    assert set(services) == {
        "redis",
        "controller",
        "worker",
        "dashboard",
        "dashboard-host",
        "autoscale",
    }
    for name, svc in services.items():
        assert interpolate(svc["command"], {}) == ours["services"][name]["command"], name
        assert "healthcheck" in svc, f"{name} has no healthcheck"
    assert "redis-data" in resolved["volumes"]

    redis_svc = services["redis"]
    assert str(redis_svc["image"]).startswith("redis:7")
    cmd = ours["services"]["redis"]["command"]  # `$$` unescaped, as the container sees it
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    flags = cmd[cmd.index("--notify-keyspace-events") + 1]
    assert set("K$gx") <= set(flags), flags
    assert any(v.split(":")[0] == "redis-data" for v in redis_svc["volumes"])

    worker = services["worker"]
    assert "container_name" not in worker, "a fixed name makes --scale worker=N impossible"
    assert "ports" not in worker, "a fixed host port makes --scale worker=N impossible"
    assert "--name" not in worker["command"], "every replica must generate a unique worker id"
    assert duration(worker["stop_grace_period"]) >= 20
    assert float(worker["environment"]["QUEUEWORKS_GRACE_PERIOD"]) < duration(
        worker["stop_grace_period"]
    ), "the warm stop must end before docker's SIGKILL"
    assert "QUEUEWORKS_REDIS_URL" in worker["environment"]
    assert worker["healthcheck"]["test"][1:4] == ["queueworks", "health", "--id-file"]

    controller = services["controller"]
    assert controller["deploy"]["replicas"] == 2
    assert "container_name" not in controller and "ports" not in controller
    assert controller["healthcheck"]["test"][1:] == ["queueworks", "health", "--controller"]

    dashboard = services["dashboard"]
    assert dashboard["command"][:2] == ["queueworks", "dashboard"]
    assert "9181" in dashboard["command"]
    published = {int(p["published"]) for p in dashboard["ports"]}
    assert published == {9181}
    assert "QUEUEWORKS_DASHBOARD_TOKEN" in dashboard["environment"]
    # its variant for a stack on the host's network (tests/test_containers.py): off by
    # default, no published port, loopback only, the same token
    host = services["dashboard-host"]
    assert host["profiles"] and "ports" not in host and host["network_mode"] == "host"
    assert host["command"][:2] == ["queueworks", "dashboard"]
    assert host["command"][host["command"].index("--host") + 1] == "127.0.0.1"
    assert host["environment"] == dashboard["environment"]

    check_autoscale(services["autoscale"], worker)

    for name in ("controller", "worker", "dashboard", "dashboard-host"):  # one image for all
        assert services[name]["image"] == services["worker"]["image"]
        assert services[name]["build"]["context"] == str(ROOT)
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"


# -- the Dockerfile (no engine here: check what it builds from) ---------------------------


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes; a directory's
    pattern covers everything under it."""
    ignored = False
    parts = path.split("/")
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").strip("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatchcase(prefix, pat) or (
                pat.startswith("**/") and fnmatchcase(parts[i - 1], pat[3:])
            ):
                ignored = not neg
                break
    return ignored


def dockerfile_instructions() -> list[str]:
    """The Dockerfile's instructions, one a line (continuations joined; no comments)."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.replace("\\\n", " ").splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def dockerignore_patterns() -> list[str]:
    return [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]


def context_wheel(tmp_path: Path) -> Path:
    """The wheel built from exactly the Dockerfile's build context (every COPY source, less
    what .dockerignore drops), as the image's ``pip install .`` builds it; checked on the way:
    every COPY source exists and is in the context."""
    await_setup("wheelhouse")  # the context has wheels/: not while it is being filled
    patterns = dockerignore_patterns()
    ctx = tmp_path / "context"
    for ln in dockerfile_instructions():
        if ln.upper().startswith("COPY ") and "--from=" not in ln:
            for src in ln.split()[1:-1]:
                path = ROOT / src
                assert path.exists(), f"Dockerfile copies {src}, which does not exist"
                assert not _dockerignored(src, patterns), f"{src} is excluded by .dockerignore"
                files = [path] if path.is_file() else sorted(path.rglob("*"))
                for f in files:
                    rel = f.relative_to(ROOT).as_posix()
                    if f.is_file() and not _dockerignored(rel, patterns):
                        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(f, ctx / rel)
    out = tmp_path / "wheel"
    wdir = ["-w", str(out), str(ctx)]
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", *wdir],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    (wheel,) = out.glob("queueworks-*.whl")
    return wheel


def test_dockerfile_builds_one_non_root_image_from_the_context(tmp_path: Path) -> None:
    text = (ROOT / "Dockerfile").read_text()
    instr = dockerfile_instructions()
    froms = [ln.split()[1] for ln in instr if ln.upper().startswith("FROM ")]
    assert froms and all(f.startswith("python:") and f.endswith("-slim") for f in froms), froms
    users = [ln.split()[1] for ln in instr if ln.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    assert any(re.search(r"pip install .*\$\{?spec", ln) for ln in instr)
    assert "ARG EXTRAS" in text and "torch" in text
    assert 'CMD ["queueworks"' in text  # the console script the compose commands call

    patterns = dockerignore_patterns()
    assert _dockerignored(".git/config", patterns)
    assert _dockerignored("tests/test_deploy.py", patterns)
    assert _dockerignored("queueworks/__pycache__/cli.cpython-311.pyc", patterns)
    # build the wheel from exactly the build context
    import zipfile

    wheel = context_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("queueworks/cli/group.py", "queueworks/lua/join.lua", "queueworks/examples.py"):
        assert needed in names, needed
    # one top-level import name: the worker and controller packages are installed under it
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"queueworks"}, top
    # every package of the repository is in it, the worker's and controller's under queueworks/
    packages = {
        i.parent.relative_to(ROOT).as_posix() for i in ROOT.glob("queueworks/**/__init__.py")
    }
    packages |= {
        f"queueworks/{i.parent.relative_to(ROOT).as_posix()}"
        for part in ("workers", "controller")
        for i in ROOT.glob(f"{part}/**/__init__.py")
    }
    missing = {p for p in packages if f"{p}/__init__.py" not in names}
    assert not missing, f"packages left out of the wheel (pyproject.toml packages): {missing}"
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).split() == [b"queueworks"]
    assert not any("__pycache__" in n or n.startswith("tests/") for n in names)


# -- docker compose up --scale worker=N, with processes -----------------------------------


def history(r: redis.Redis, keys: Keys, task_id: str) -> list[dict[str, str]]:
    raw: Any = r.xrange(keys.task(task_id).history)
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in raw]


def seconds_of(i: int) -> float:
    """Payload of subtask i for examples:sleep: ~50 ms, distinct per i mod 1000. The
    task's length is in worker-seconds: longer subtasks make it of fewer round trips."""
    return round(0.05 + (i % 1000) * 1e-6, 6)


@pytest.mark.slow(45)
def test_scale_workers_2_6_1_4_while_a_task_runs(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, tmp_path: Path
) -> None:
    compose = load_compose(
        {"QUEUEWORKS_REDIS_URL": cluster.redis_url, "QUEUEWORKS_PREFIX": cluster.prefix}
    )
    services = compose["services"]
    for name in ("controller", "worker"):
        env = services[name]["environment"]
        assert env["QUEUEWORKS_REDIS_URL"] == cluster.redis_url
        assert env["QUEUEWORKS_PREFIX"] == cluster.prefix
    controllers = Service(cluster, "controller", services["controller"], tmp_path)
    workers = Service(cluster, "worker", services["worker"], tmp_path)
    t0 = time.monotonic()
    marks: dict[str, float] = {}

    controllers.scale(int(services["controller"]["deploy"]["replicas"]))
    workers.scale(int(services["worker"]["deploy"]["replicas"]))
    assert len(workers.running) == 2
    cluster.wait_workers(r, 2, timeout=60)
    # The task must outlast the scaling, which is mostly processes starting (seven more):
    # as long as they start in a second or two, 800 subtasks of ~50 ms (40 worker-seconds);
    # on a machine that starts them slower, more, in proportion
    startup = time.monotonic() - t0
    total = max(N_SUBTASKS, int(WORK_PER_STARTUP * startup / seconds_of(0)))
    task = client.submit(
        TaskSpec(
            name="scale",
            handler="queueworks.examples:sleep",
            subtasks=({"seconds": seconds_of(i)} for i in range(total)),
            max_attempts=5,
        )
    )

    def nodes_are(n: int) -> bool:
        status = task.status()
        assert not status.finished, f"the task ended before the scale to {n} was seen: {status}"
        return len(status.nodes) == n

    # each look is two status reads of the whole node set: five a second is plenty
    wait_for(lambda: nodes_are(2) and task.status().done > 0, 60, "2 members working", 0.2)
    marks["2"] = time.monotonic() - t0

    stopped: list[tuple[str, float]] = []
    health_checked = False
    for n in SCALE_STEPS:
        ids_before = {p.name: workers.worker_id(p) for p in workers.running}
        for proc, sent in workers.scale(n):
            stopped.append((ids_before[proc.name], sent))
        wait_for(lambda n=n: nodes_are(n), 90, f"the node set to become {n} workers", 0.2)
        marks[str(n)] = time.monotonic() - t0
        if not health_checked:  # the compose healthchecks, run inside the "containers"
            res = workers.healthcheck(workers.running[0])
            assert res.returncode == 0, res.stderr
            res = controllers.healthcheck(controllers.running[0])
            assert res.returncode == 0, res.stderr
            health_checked = True
    assert task.status().done < total, "every scale step must happen while the task runs"

    status = task.wait(timeout=300)
    marks["done"] = time.monotonic() - t0
    assert status.state == TaskState.COMPLETED, status
    assert (status.done, status.dead) == (total, 0)
    results = dict(task.results())
    assert results == {i: seconds_of(i) for i in range(total)}

    # every scale-down was a graceful leave: the member removed itself, nobody waited a TTL
    entries = history(r, keys, task.id)
    causes = [e["cause"] for e in entries]
    assert "dead" not in causes, entries
    leave_ts = {e["worker"]: float(e["ts"]) for e in entries if e["cause"] == "leave"}
    assert len(stopped) == 5
    for worker_id, _ in stopped:
        assert worker_id in leave_ts, f"{worker_id} was stopped but did not leave: {entries}"
    joined = {e["worker"] for e in entries if e["cause"] == "join"}
    all_ids = {workers.worker_id(p) for p in workers.running} | {w for w, _ in stopped}
    assert len(all_ids) == 2 + 4 + 3, "every replica has its own worker id"
    assert all_ids == joined
    # a stopped worker's healthcheck fails: its heartbeat is gone
    gone = next(p for p in cluster.procs if p.name.startswith("worker-") and not p.alive())
    assert workers.healthcheck(gone).returncode != 0

    # docker compose down: everyone gets SIGTERM and exits 0; the lease is released, not
    # left to expire; the pool is empty
    workers.scale(0)
    controllers.scale(0)
    assert not r.exists(keys.leader)
    assert r.zcard(keys.workers) == 0
    leave_latency = max(leave_ts[w] - sent for w, sent in stopped)
    print(
        f"\nscale timeline (s since start, {total} subtasks): {marks};"
        f" slowest leave after SIGTERM: {leave_latency:.3f} s"
    )


def test_the_health_check_imports_no_client_and_no_other_command(cluster: Cluster) -> None:
    """Every container runs ``queueworks health`` every few seconds: it imports what it
    uses (its command, the options and failures, redis), not the client and every other
    command (on a loaded host, a check that takes seconds to start times out)."""
    code = (
        "import sys\n"
        "from queueworks.cli import main\n"
        "try:\n"
        "    main(['health', '--redis', sys.argv[1]], prog_name='queueworks')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "ours = ('queueworks.client', 'queueworks.cli.', 'queueworks.task')\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(ours))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, cluster.redis_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "ok", lines
    imported = set(lines[1].split())
    assert imported == {
        "queueworks.cli.failures",
        "queueworks.cli.group",
        "queueworks.cli.health",
        "queueworks.cli.options",
    }, imported


def test_dashboard_service_serves_its_healthcheck(
    cluster: Cluster, tmp_path: Path, r: redis.Redis
) -> None:
    """The reserved dashboard service: its command serves /healthz (its healthcheck), stops
    on SIGTERM; without a token it refuses to bind beyond loopback, saying why."""
    token = f"tok-{cluster.prefix}"
    env = {"QUEUEWORKS_REDIS_URL": cluster.redis_url, "QUEUEWORKS_PREFIX": cluster.prefix}
    spec = load_compose({**env, "QUEUEWORKS_DASHBOARD_TOKEN": token})["services"]["dashboard"]
    assert spec["environment"]["QUEUEWORKS_DASHBOARD_TOKEN"] == token
    (port,) = (int(p.split(":")[-1]) for p in spec["ports"])
    dashboard = Service(cluster, "dashboard", spec, tmp_path, ports={port: free_port()})
    proc = dashboard.start_one()
    wait_for(
        lambda: not proc.alive() or dashboard.healthcheck(proc).returncode == 0,
        60,
        "the dashboard's healthcheck to pass",
        interval=0.5,
    )
    assert proc.alive(), proc.log()
    assert token not in proc.log()
    # SIGTERM: exits by itself within stop_grace_period (uvicorn shuts down gracefully,
    # then re-raises the signal: 143 in docker, a clean stop all the same)
    dashboard.scale(0, ok=(0, -signal.SIGTERM))
    assert "Finished server process" in proc.log()

    no_token = load_compose(env)["services"]["dashboard"]
    refused = Service(cluster, "dashboard-no-token", no_token, tmp_path, ports={port: free_port()})
    proc = refused.start_one()
    assert proc.p.wait(60) != 0
    assert "token" in proc.log().lower()
