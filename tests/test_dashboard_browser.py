"""Issue 6: the real dashboard page in headless Chromium (Debian's ``chromium``, driven by
Playwright): a running task's progress bar advances, its node set shows ranks, a SIGKILLed
worker shows up as a new epoch without a reload, and cancelling from the page cancels it.

Real processes: a controller, three workers and ``python -m queueworks dashboard``.
Budget: ~20 s. ``QUEUEWORKS_SCREENSHOT=docs/dashboard-task.png`` also writes the task page
screenshot shown in docs/dashboard.md.
"""

from __future__ import annotations

import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from playwright.sync_api import Browser, Page, sync_playwright

from queueworks import Client, TaskSpec, TaskState
from queueworks.contrib.redis_server import free_port
from tests.conftest import ROOT, Cluster, need_program, wait_for

pytestmark = pytest.mark.system

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FAST_HEARTBEAT = ["--heartbeat-interval", "0.5", "--heartbeat-ttl", "1.5"]


@pytest.fixture
def browser() -> Iterator[Browser]:
    chromium = need_program("chromium", "apt-get install chromium")  # Debian's, not a download
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def start_dashboard(cluster: Cluster) -> str:
    port = free_port()
    cluster.spawn(["dashboard", "--port", str(port), "--refresh", "0.5"], "dashboard")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    wait_for(up, 20, "the dashboard to answer", interval=0.1)
    return base


def wait_js(page: Page, expression: str, arg: Any = None, timeout: float = 20.0) -> None:
    """Poll a JS function until it returns true. (``page.wait_for_function`` evaluates its
    predicate with ``eval``, which the dashboard's Content-Security-Policy forbids; plain
    ``evaluate`` goes through DevTools, so the page keeps its real CSP in these tests.)"""
    wait_for(lambda: page.evaluate(expression, arg), timeout, expression, interval=0.1)


def number(page: Page, selector: str, attr: str | None = None) -> float:
    raw: Any = page.get_attribute(selector, attr) if attr else page.inner_text(selector)
    return float(raw)


def test_task_page_live_progress_kill_and_cancel(
    cluster: Cluster, client: Client, r: redis.Redis, browser: Browser, tmp_path: Path
) -> None:
    cluster.controller()
    procs = {f"wb{i}": cluster.worker(f"wb{i}", extra=FAST_HEARTBEAT) for i in range(3)}
    cluster.wait_workers(r, 3)
    base = start_dashboard(cluster)
    task = client.submit(
        TaskSpec(
            name="thumbnails",
            handler="tests.handlers:double_slow",
            subtasks=({"x": i, "seconds": 0.02} for i in range(4000)),
            max_nodes=3,
        )
    )
    wait_for(lambda: len(task.status().nodes) == 3, 20, "three members in the node set")

    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.on("dialog", lambda dialog: dialog.accept())
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.goto(f"{base}/tasks/{task.id}")
    page.evaluate("window.__noReload = 1")  # gone if the page ever reloads

    # the progress bar advances without a reload
    first = number(page, "#task-progress", "value")
    wait_js(page, "v => Number(document.querySelector('#task-progress').value) >= v + 30", first)
    # the node set shows every member with its rank
    wait_js(page, "() => document.querySelectorAll('#node-set tbody tr').length === 3")
    rows = page.locator("#node-set tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.rank, r.dataset.worker])"
    )
    assert sorted(rank for rank, _ in rows) == ["0", "1", "2"]
    assert {w for _, w in rows} == set(procs)
    wait_js(page, "() => Number(document.querySelector('#task-progress').value) >= 400")
    shot = tmp_path / "dashboard-task.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    target = os.environ.get("QUEUEWORKS_SCREENSHOT")
    if target:
        shutil.copyfile(shot, ROOT / target)

    # SIGKILL one member: the page shows the new epoch and a node set of two
    epoch = int(number(page, "#task-epoch"))
    victim = dict((rank, w) for rank, w in rows)["1"]
    procs[victim].kill()
    wait_js(
        page,
        """e => Number(document.querySelector('#task-epoch').textContent) > e
             && document.querySelectorAll('#node-set tbody tr').length === 2""",
        epoch,
    )
    left = page.locator("#node-set tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.worker)"
    )
    assert victim not in left
    page.wait_for_selector(f"#epoch-history tr[data-epoch='{epoch + 1}'] .c-dead", timeout=10_000)
    assert page.evaluate("window.__noReload") == 1

    # cancel from the page (through its confirm dialog)
    page.click("button:has-text('Cancel task')")
    wait_js(page, "() => document.querySelector('#task-state').textContent === 'cancelled'")
    assert task.status().state == TaskState.CANCELLED
    assert "Task cancelled." in page.inner_text("#flash")
    assert page.is_disabled("button:has-text('Cancel task')")
    assert page.evaluate("window.__noReload") == 1

    # the overview charted the throughput it sampled while the task ran
    page.goto(f"{base}/")
    heights = page.locator("#throughput rect").evaluate_all(
        "rects => rects.map(r => Number(r.getAttribute('height')))"
    )
    assert len(heights) == 30 and max(heights) > 0
    assert page.inner_text("#tasks-cancelled") == "1"
    assert problems == []  # no script error, no CSP violation
    page.close()
