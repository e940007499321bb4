"""Health badges, one job's buttons and dark mode in headless Chromium (as
``test_dashboard_browser.py``): a queue with a backlog and no member, and a paused one, show
their badges on the overview, the queue list and their page; a row's Cancel and a dead
job's Requeue work from the page (each asks first); the pages turn dark where the browser
asks for it; a done job's page shows its payload, and no empty box.

A member is played by hand (``test_job_views``); the dashboard is a real process.
"""

from __future__ import annotations

import pytest
import redis
from playwright.sync_api import Browser

from queueworks import Client
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState
from tests.conftest import Cluster, wait_for
from tests.test_dashboard_browser import browser, start_dashboard, wait_js
from tests.test_job_views import H, read_one, settle

pytestmark = pytest.mark.system
__all__ = ["browser"]  # the fixture, used by name

BG = "() => getComputedStyle(document.body).backgroundColor"


def test_badges_job_buttons_and_dark_mode(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, browser: Browser
) -> None:
    q = client.queue("hb")
    tk = keys.task("hb")
    dead = q.enqueue(H, {"x": 1})
    settle(client, tk, [read_one(r, tk)], dead=True)
    done = q.enqueue(H, {"x": 4})
    settle(client, tk, [read_one(r, tk)])
    waiting = q.enqueue(H, {"x": 2})
    held = client.queue("hb-paused")
    held.pause()
    held.enqueue(H, {"x": 3})
    base = start_dashboard(cluster)
    page = browser.new_page(base_url=base)
    asked: list[str] = []
    page.on("dialog", lambda d: (asked.append(d.message), d.accept()))

    for path in ("/", "/queues"):
        page.goto(path)
        badge = page.locator('tr[data-queue="hb"] [data-field="warnings"]')
        assert badge.is_visible() and "warning" in badge.inner_text()
        assert page.locator('tr[data-queue="hb-paused"] [data-field="paused"]').is_visible()
    page.goto("/queues/hb")
    assert "No member serves this queue" in page.inner_text("#warnings")
    assert page.inner_text("#live-toggle") == "Stop updates"  # not a second "Pause"

    page.goto(f"/queues/hb/jobs/{done.id}")  # a done job keeps its payload; no empty box
    assert page.inner_text("#job-payload") == '{"x":4}'
    boxes = page.locator("section.controls")
    for i in range(boxes.count()):
        assert boxes.nth(i).locator("button").count() > 0, boxes.nth(i).inner_html()
    assert page.locator('#job-actions button:text-is("Delete")').is_visible()

    page.goto("/queues/hb?jobs=queued")
    page.click(f'tr[data-job="{waiting.id}"] button:text-is("Cancel")')
    wait_for(lambda: waiting.status().state == JobState.CANCELLED, 10, "the job cancelled")
    page.goto(f"/queues/hb/jobs/{dead.id}")
    page.click('#job-actions button:text-is("Requeue")')
    wait_for(lambda: dead.status().state == JobState.QUEUED, 10, "the dead job requeued")
    wait_js(page, "() => document.getElementById('job-state').textContent === 'queued'")
    assert len(asked) == 1 and waiting.id in asked[0]  # Cancel asked first; Requeue need not

    light = page.evaluate(BG)
    page.emulate_media(color_scheme="dark")
    dark = page.evaluate(BG)
    assert light != dark and dark == "rgb(18, 22, 28)", (light, dark)
    page.close()
