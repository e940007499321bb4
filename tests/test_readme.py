"""The README stays true: its Python examples and its demo command run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT, TORCH_INSTALL, Cluster, need_packages

pytestmark = pytest.mark.system

README = (ROOT / "README.md").read_text()


def python_blocks(text: str = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


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


def test_readme_python_examples_run(redis_url: str, tmp_path: Path) -> None:
    run_blocks(python_blocks(), "README.md", redis_url, tmp_path)


def test_queue_docs_examples_run(redis_url: str, tmp_path: Path) -> None:
    page = (ROOT / "docs" / "queues.md").read_text()
    run_blocks(python_blocks(page), "docs/queues.md", redis_url, tmp_path)


def test_asyncio_docs_examples_run(redis_url: str, tmp_path: Path) -> None:
    page = (ROOT / "docs" / "asyncio.md").read_text()
    worker = ("--concurrency", "50")  # as the page says its workers run
    run_blocks(python_blocks(page), "docs/asyncio.md", redis_url, tmp_path, worker)


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
