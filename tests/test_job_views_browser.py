"""The queue's job views and actions in headless Chromium (as ``test_dashboard_browser.py``):
every page at 1400 and 420 px wide with hostile values stored in the fields it shows — no
horizontal page scroll, no markup from the values, the controls on screen — then every
queue action clicked (each asks first), and the live toggle.

A member is played by hand (``test_job_views``); the dashboard is a real process.
Budget: ~20 s.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from playwright.sync_api import Browser, Page

from queueworks import Client
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState
from tests.conftest import Cluster, wait_for
from tests.test_dashboard_browser import browser, start_dashboard, wait_js
from tests.test_dashboard_hostile import hostile
from tests.test_job_views import H, read_one, settle

pytestmark = pytest.mark.system
__all__ = ["browser"]  # the fixture, used by name

WIDTHS = (1400, 420)
NO_SIDEWAYS = "() => document.documentElement.scrollWidth <= window.innerWidth + 1"
CONTROLS_ON_SCREEN = """() => [...document.querySelectorAll('.controls button')].every(b => {
  const r = b.getBoundingClientRect(); return r.left >= 0 && r.right <= window.innerWidth + 1; })"""


def plant(client: Client, r: redis.Redis, keys: Keys) -> dict[str, Any]:
    q = client.queue("bq")
    tk = keys.task("bq")
    dead = q.enqueue(H, {"x": hostile("dead-payload")})
    settle(client, tk, [read_one(r, tk)], dead=True)
    r.hset(tk.job(dead.id), "reason", hostile("dead-reason"))
    waiting = q.enqueue(H, {"x": hostile("job-payload")})
    later = q.enqueue(H, {"x": hostile("later")}, delay=600)
    [q.enqueue(H, {"x": i}) for i in range(30)]  # a second page of queued jobs
    now = repr(time.time())
    r.xadd(  # a lost worker (on /workers) and a dead letter's event (on / and the queue's)
        keys.workers_lost,
        {
            "worker": hostile("lost-id"),
            "ts": now,
            "host": hostile("lost-host"),
            "pid": "7",
            "task": "bq",
            "member_of": json.dumps(["bq", hostile("lost-queue")]),
        },
    )
    r.xadd(
        keys.events,
        {
            "kind": "dead_lettered",
            "ts": now,
            "task": "bq",
            "count": "1",
            "job": hostile("ev-job"),
            "reason": hostile("ev-reason"),
        },
    )
    return {"q": q, "dead": dead, "waiting": waiting, "later": later}


def check(page: Page, path: str, width: int) -> list[str]:
    page.goto(path)
    problems = []
    if not page.evaluate(NO_SIDEWAYS):
        page.wait_for_timeout(500)  # a layout still settling on a loaded machine: look again
        if not page.evaluate(NO_SIDEWAYS):
            problems.append(f"{path} at {width}px: the page scrolls sideways")
    if not page.evaluate(CONTROLS_ON_SCREEN):
        problems.append(f"{path} at {width}px: a control is off screen")
    if page.query_selector("qwx-injected, script:not([src])"):
        problems.append(f"{path} at {width}px: a stored value became markup")
    return problems


def test_job_views_at_two_widths_and_every_action(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, browser: Browser
) -> None:
    got = plant(client, r, keys)
    q = got["q"]
    base = start_dashboard(cluster)
    pages = [
        "/",
        "/queues",
        "/queues/bq",
        "/queues/bq?jobs=scheduled",
        "/queues/bq?jobs=dead",
        "/queues/bq?jobs=queued&jobs_offset=20",
        f"/queues/bq/jobs/{got['waiting'].id}",
        f"/queues/bq/jobs/{got['dead'].id}",
        "/workers",
        "/tasks",
    ]
    problems: list[str] = []
    for width in WIDTHS:
        page = browser.new_page(viewport={"width": width, "height": 900}, base_url=base)
        for path in pages:
            problems += check(page, path, width)
        page.goto("/workers")  # the lost worker's row is there, on screen's width
        assert page.query_selector("#lost-workers tr[data-lost-worker]")
        page.close()
    assert problems == []

    page = browser.new_page(viewport={"width": 420, "height": 900}, base_url=base)
    asked: list[str] = []

    def confirm(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", confirm)
    page.goto("/search?q=" + got["waiting"].id)  # the search finds the job
    assert page.url.endswith(f"/queues/bq/jobs/{got['waiting'].id}")
    shown_payload = page.inner_text("#job-payload")  # the JSON, as text
    assert "QWX-job-payload" in shown_payload and "<script>alert(1)</script>" in shown_payload

    page.goto("/queues/bq")
    page.click("#live-toggle")  # live updates stop
    wait_js(page, "() => document.getElementById('live-status').textContent === 'paused'")
    shown = page.inner_text("#queue-backlog")
    q.enqueue(H, {"x": 1})
    page.wait_for_timeout(1200)  # three refresh periods: nothing may change
    assert page.inner_text("#queue-backlog") == shown
    page.click("#live-toggle")
    wait_js(page, "(n) => document.getElementById('queue-backlog').textContent !== n", shown)

    page.click(".controls button:text-is('Pause')")
    wait_for(lambda: q.status().paused, 10, "the queue paused")
    wait_js(page, "() => !!document.getElementById('queue-paused')")
    page.click(".controls button:text-is('Resume')")
    wait_for(lambda: not q.status().paused, 10, "the queue resumed")
    # the live refresh redraws the controls once it sees the queue resumed: click after it
    wait_js(page, "() => !document.getElementById('queue-paused')")
    page.click(".controls button:text-is('Empty')")
    wait_for(lambda: q.status().backlog == 0, 10, "the backlog emptied")
    page.click("#job-states >> text=scheduled")
    page.click("text=Run now")
    wait_for(lambda: got["later"].status().state == JobState.QUEUED, 10, "the job run now")
    page.click("text=Requeue all dead")
    wait_for(lambda: got["dead"].status().state == JobState.QUEUED, 10, "the dead job requeued")
    tk = keys.task("bq")
    settle(client, tk, [read_one(r, tk)], dead=True)
    page.reload()
    page.click("text=Delete all dead")
    wait_for(lambda: r.xlen(tk.dead) == 0, 10, "the dead letters deleted")
    assert len(asked) == 5 and all(m for m in asked)  # every action but Resume asked first
