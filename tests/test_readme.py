"""The README stays true: its first handler, its Python examples and its demo command run
as written, and so do the docs' examples (tasks, queues, asyncio)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from queueworks.contrib.redis_server import free_port
from tests.conftest import ROOT, TORCH_INSTALL, Cluster, need_packages, wait_for

pytestmark = pytest.mark.system

README = (ROOT / "README.md").read_text()


def python_blocks(text: str = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def section(text: str, heading: str) -> str:
    """The text under ``## heading``, up to the next ``## `` heading."""
    found = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert found, f"README.md has a section {heading!r}"
    return found.group(1)


def run_blocks(
    blocks: list[str], where: str, redis_url: str, tmp_path: Path, worker: tuple[str, ...] = ()
) -> None:
    """Run a page's Python examples in order, against a controller and a worker that
    allows ``queueworks.examples`` (the examples use prefix "qw" and localhost: they are
    pointed at the test server)."""
    assert blocks, f"{where} has Python examples"
    cluster = Cluster(redis_url, "qw", tmp_path)
    r = redis.Redis.from_url(redis_url)
    try:
        cluster.controller()
        cluster.worker(allow=("queueworks.examples",), extra=list(worker))
        cluster.wait_workers(r, 1)
        for code in blocks:
            code = code.replace("redis://localhost:6379/0", redis_url)
            exec(compile(code, where, "exec"), {"__name__": "readme"})
    finally:
        cluster.close()
        for key in r.scan_iter(match="qw:*"):  # prefix "qw" is shared by every page's
            r.delete(key)


def command(line: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """A README line ``[VAR=value ...] queueworks ARGS  # comment`` as a process to start:
    ``python -P -m queueworks ARGS`` (``-P``: as the installed ``queueworks`` script, it
    does not put the current folder on ``sys.path``), with its variables set (a
    ``PYTHONPATH`` given keeps this checkout's code importable after it)."""
    words = shlex.split(line, comments=True)
    env = dict(env)
    while "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        env[name] = f"{value}{os.pathsep}{ROOT}" if name == "PYTHONPATH" else value
    assert words[0] == "queueworks", line
    return [sys.executable, "-P", "-m", "queueworks", *words[1:]], env


@contextmanager
def processes(logs: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started in the block, each logging to a file in ``logs``; on the way out,
    SIGTERM (a warm stop) to each, newest first, and the logs of any failure."""
    logs.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    except BaseException:
        for log in sorted(logs.iterdir()):
            print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-3000:]}")
        raise
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_readme_first_handler_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """'Your first handler' as a newcomer follows it, in a new folder: myjobs.py as the
    README shows it; its commands started there as written (the server on a free port
    instead of 6379, the others told its URL), the worker pool of two; then its Python example
    and its shell examples, run there, unedited, with the same variables as the commands.
    Every Python example of the README is in it."""
    text = section(README, "Your first handler")
    module, example = python_blocks(text)
    assert python_blocks() == [module, example], "a README example outside the section"
    assert module.startswith("# myjobs.py\n"), module
    folder = tmp_path / "first"
    folder.mkdir()
    (folder / "myjobs.py").write_text(module)
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUEWORKS_")}
    env |= {"QUEUEWORKS_REDIS_URL": url, "PYTHONPATH": str(ROOT)}
    starts, shell = bash_blocks(text)
    lines = starts.strip().splitlines()
    assert [shlex.split(line, comments=True)[1:] for line in lines[1:]] == [
        ["controller"],
        ["worker", "--allow", "myjobs", "--processes", "2"],
    ], lines
    r = redis.Redis.from_url(url)

    def start(name: str, line: str, *more: str) -> None:
        argv, proc_env = command(line, env)
        log = (tmp_path / "logs" / f"{name}.log").open("wb")
        procs.append(
            subprocess.Popen([*argv, *more], cwd=folder, env=proc_env, stdout=log, stderr=log)
        )

    with processes(tmp_path / "logs") as procs:
        assert shlex.split(lines[0], comments=True) == ["queueworks", "redis"], lines[0]
        start("redis", lines[0], "--port", str(port))
        wait_for(lambda: _pings(r), 20, "the README's Redis answers")
        start("controller", lines[1])
        start("workers", lines[2])  # a pool of two
        wait_for(lambda: r.zcard("qw:workers") >= 2, 30, "the README's two workers registered")
        assert "Client.from_env()" in example and "redis://" not in example, example
        for name, value in env.items():  # what the commands were given, as a shell would
            if name.startswith("QUEUEWORKS_"):
                monkeypatch.setenv(name, value)
        monkeypatch.syspath_prepend(str(folder))  # Python started in that folder
        monkeypatch.delitem(sys.modules, "myjobs", raising=False)
        exec(compile(example, "README.md", "exec"), {"__name__": "readme"})
        enqueue, info = (line for line in shell.strip().splitlines())
        for line, expect in ((enqueue, r"\n49\n$"), (info, r"maths")):
            argv, proc_env = command(line, env)
            out = subprocess.run(argv, cwd=folder, env=proc_env, capture_output=True, text=True)
            assert out.returncode == 0, (line, out.stdout, out.stderr)
            assert re.search(expect, out.stdout), (line, out.stdout)


def _pings(r: redis.Redis) -> bool:
    try:
        return bool(r.ping())
    except redis.ConnectionError:
        return False


def test_tasks_docs_examples_run(redis_url: str, tmp_path: Path) -> None:
    page = (ROOT / "docs" / "tasks.md").read_text()
    run_blocks(python_blocks(page), "docs/tasks.md", redis_url, tmp_path)


def test_queue_docs_examples_run(redis_url: str, tmp_path: Path) -> None:
    page = (ROOT / "docs" / "queues.md").read_text()
    run_blocks(python_blocks(page), "docs/queues.md", redis_url, tmp_path)


def test_asyncio_docs_examples_run(redis_url: str, tmp_path: Path) -> None:
    page = (ROOT / "docs" / "asyncio.md").read_text()
    worker = ("--concurrency", "50")  # as the page says its workers run
    run_blocks(python_blocks(page), "docs/asyncio.md", redis_url, tmp_path, worker)


def _allowed(handler: str, prefixes: list[str]) -> bool:
    module = handler.split(":")[0]
    return any(module == p or module.startswith(p.rstrip(".") + ".") for p in prefixes)


@pytest.mark.parametrize("page", ["tasks.md", "queues.md", "asyncio.md"])
def test_docs_start_workers_that_may_run_their_first_example(page: str) -> None:
    """The worker a page tells the reader to start before its first example may run the
    handlers that example gives (a job it may not run would wait for ever)."""
    text = (ROOT / "docs" / page).read_text()
    before, _, rest = text.partition("```python\n")
    first = rest.split("```", 1)[0]
    prefixes = re.findall(r"queueworks worker\s+--allow\s+([\w.]+)", before)
    handlers = re.findall(r'"(\w+\.[\w.]+:\w+)"', first)  # a module path, not prose
    assert prefixes and handlers, (page, prefixes, handlers)
    assert all(_allowed(h, prefixes) for h in handlers), (page, prefixes, handlers)


def test_fastapi_section_starts_workers_that_may_run_its_jobs() -> None:
    text = (ROOT / "docs" / "asyncio.md").read_text()
    found = re.search(r"^## A web service: FastAPI\n(.*?)(?=^## )", text, flags=re.M | re.S)
    assert found, "docs/asyncio.md has its FastAPI section"
    prefixes = re.findall(r"queueworks worker\s+--allow\s+([\w.]+)", found.group(1))
    service = (ROOT / "examples" / "fastapi_service.py").read_text()
    handlers = re.findall(r'enqueue\(\s*"([\w.]+:\w+)"', service)
    assert prefixes and handlers, (prefixes, handlers)
    assert all(_allowed(h, prefixes) for h in handlers), (prefixes, handlers)


def test_readme_demo_command_runs() -> None:
    commands = re.findall(r"^\./install\.sh && (queueworks demo[^\n]*)$", README, flags=re.M)
    assert commands == ["queueworks demo --embedded"]
    demo = commands[0].split()[1:]
    out = subprocess.run(
        [sys.executable, "-m", "queueworks", *demo],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert re.search(r"completed: done=5000 dead=0", out.stdout), out.stdout[-2000:]
    peak = re.search(r"largest node set=(\d+) of 3 workers", out.stdout)
    assert peak and 1 <= int(peak.group(1)) <= 3, out.stdout[-2000:]
    assert "nodes=0" not in out.stdout


@pytest.mark.slow(40)
@pytest.mark.timeout(600)  # five processes that import torch
def test_readme_training_example_runs() -> None:
    """The README's elastic-training command: one job scaled 2 -> 4 -> 1 workers. Shorter
    than as the README runs it (1,800 shards, paced 0.03 s, a change every 12 s: a minute
    and more to watch): 600 shards paced 0.01 s, a change every 6 s."""
    assert "python examples/elastic_training.py --scale 2,4,1" in README
    need_packages("torch", "numpy", install=TORCH_INSTALL)
    shorter = ["--every", "6", "--shards", "600", "--pace", "0.01"]
    out = subprocess.run(
        [sys.executable, "examples/elastic_training.py", "--scale", "2,4,1", *shorter],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "scaling to 4 worker(s)" in out.stdout, out.stdout[-2000:]
    assert re.search(r"completed: (\d+)/\1 shards, 0 dead", out.stdout), out.stdout[-2000:]


def test_readme_is_short_and_points_at_the_docs_index() -> None:
    """The README stays an entry point (at most 800 words, as ``wc -w`` counts them, code
    included); the rest lives in docs/, whose index it links."""
    assert len(README.split()) <= 800, len(README.split())
    for heading in ("Install", "Quickstart", "Your first handler", "A short tour"):
        section(README, heading)
    assert "(docs/README.md)" in README


def test_docs_index_lists_every_page_once() -> None:
    """docs/README.md names every page of docs/ once, each link to a page that exists."""
    index = (ROOT / "docs" / "README.md").read_text()
    linked = re.findall(r"^\d+\. \[[\w.]+\]\(([\w.]+\.md)\)", index, flags=re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert sorted(linked) == pages, (linked, pages)
