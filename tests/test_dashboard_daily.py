"""The smaller points of a team's daily use: times in UTC to the millisecond, labelled; a
job's duration on its page and in finished lists; every job id a link; ``--refresh`` as
given; the header's live-update button named apart from a queue's Pause; ``/metrics`` in a
new tab.

Real Redis, a real worker process; the dashboard in-process (``make_app``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

import httpx
import pytest

from queueworks import Client
from queueworks.dashboard.arguments import positional_names
from queueworks.dashboard.templating import clock, took
from queueworks.job_functions import arguments_of
from queueworks.protocol.models import JobState
from queueworks.task.tasks import node_infos
from tests.conftest import Cluster, wait_for
from tests.test_dashboard import make_app
from workers.ledger import failed_reason


@pytest.fixture
def web(client: Client) -> Iterator[httpx.Client]:
    with make_app(client) as http:
        yield http


@pytest.mark.unit
def test_times_are_utc_to_the_millisecond_and_durations_read_well() -> None:
    assert clock(0.0) == "1970-01-01 00:00:00.000 UTC"
    assert clock(1796119558.1234) == "2026-12-01 10:05:58.123 UTC"
    assert clock(1.9996) == "1970-01-01 00:00:02.000 UTC"  # rounds into the next second
    assert clock(None) == "-"
    assert took(10.0, 10.085) == "85 ms"
    assert took(10.0, 12.414) == "2.41 s"
    assert took(0.0, 303.0) == "5m 3s"
    assert took(None, 1.0) == took(1.0, None) == "-"


@pytest.mark.unit
def test_a_reason_counts_its_attempts_in_words_and_arguments_take_their_names() -> None:
    assert failed_reason(1) == "failed 1 time" and failed_reason(3) == "failed 3 times"
    sent = '{"args": [4, 5, 6], "kwargs": {"note": "n"}}'
    assert arguments_of(sent) == [("#0", "4"), ("#1", "5"), ("#2", "6"), ("note", '"n"')]
    named = [("a", "4"), ("b", "5"), ("#2", "6"), ("note", '"n"')]
    assert arguments_of(sent, ["a", "b"]) == named  # one too many: by position still
    assert arguments_of('{"x": 1}', ["a"]) is None  # no typed call's wire form


@pytest.mark.unit
def test_the_dashboard_imports_a_handler_only_under_its_allow_prefixes() -> None:
    assert "json.tool" not in sys.modules
    assert positional_names("json.tool:main", ("tests",)) == ()  # outside: not imported
    assert "json.tool" not in sys.modules
    assert positional_names("tests.handlers_typed:add", ("tests.handlers_typed",)) == ("a", "b")
    assert positional_names("tests.handlers:double", ("tests",)) == ()  # no typed job
    assert positional_names("tests.__init__:x", ("tests",)) == ()  # no dunder part


@pytest.mark.unit
def test_a_node_set_shows_as_current_only_a_job_of_its_own() -> None:
    members = [(b"w1", 1.0), (b"w2", 1.0), (b"w3", 2.0)]
    replies = [
        b"9.5",
        [b"o-1", b"q2/o-1 q1/m-2 q1/m-3"],
        b"9.5",
        [b"7", None],
        None,
        [b"x", b"q2/x"],
    ]
    nodes = node_infos(members, replies, 10.0, "q1")
    assert [n.current for n in nodes] == ["m-2", "7", None]  # a subtask's index as it was
    assert [n.heartbeat_age for n in nodes] == [0.5, 0.5, None]


@pytest.mark.integration
def test_a_job_page_has_no_empty_box_in_any_state(client: Client, web: httpx.Client) -> None:
    q = client.queue("daily-box")
    jobs = {
        "queued": q.enqueue("tests.handlers:double", {"x": 1}),
        "scheduled": q.enqueue("tests.handlers:double", {"x": 2}, delay=600),
    }
    jobs["cancelled"] = q.enqueue("tests.handlers:double", {"x": 3}, delay=600)
    jobs["cancelled"].cancel()
    for state, job in jobs.items():
        page = web.get(f"/queues/{q.name}/jobs/{job.id}").text
        assert f'id="job-state" hidden>{state}<' in page
        for box in re.findall(r'<section class="controls"[^>]*>(.*?)</section>', page, re.S):
            assert "<button" in box, (state, box)


@pytest.mark.integration
def test_refresh_is_honoured_and_the_header_names_its_buttons(client: Client) -> None:
    with make_app(client, refresh=5.0) as web:
        page = web.get("/").text
    assert 'data-refresh="5000"' in page
    assert 'id="live-toggle"' in page and ">Stop updates</button>" in page
    assert re.search(r'<a href="/metrics" target="_blank" rel="noopener"[^>]*>/metrics ↗</a>', page)


@pytest.mark.system
def test_a_job_page_shows_its_duration_and_links_every_job_id(
    cluster: Cluster, client: Client, web: httpx.Client
) -> None:
    q = client.queue("daily-h")
    first = q.enqueue("tests.handlers:double", {"x": 1}, delay=600)
    then = q.enqueue("tests.handlers:double", {"x": 2}, depends_on=[first])
    page = web.get(f"/queues/{q.name}/jobs/{then.id}").text
    assert (
        f'<a href="/queues/{q.name}/jobs/{first.id}"><code>{q.name}/{first.id}</code></a>' in page
    )
    q.schedule("tick", "tests.handlers:double", {"x": 3}, every=1.0)
    busy = [q.enqueue("tests.handlers:sleep_for", {"seconds": 60.0}) for _ in range(2)]
    done = q.enqueue("tests.handlers:double", {"x": 4})
    cluster.controller()  # the schedule fires where a controller leads
    cluster.worker("w-daily", extra=["--concurrency", "4"])
    assert done.result(timeout=60) == 8
    wait_for(lambda: all(b.status().state == JobState.RUNNING for b in busy), 60, "two running")

    status = done.status()
    assert status.started_at is not None and status.finished_at is not None
    page = web.get(f"/queues/{q.name}/jobs/{done.id}").text
    assert f'id="job-duration">{took(status.started_at, status.finished_at)}<' in page
    assert clock(status.finished_at) in page and " UTC" in page
    listing = web.get(f"/queues/{q.name}?jobs=done").text
    assert 'data-field="took"' in listing
    links = [f'<a href="/queues/{q.name}/jobs/{b.id}"><code>{b.id}</code></a>' for b in busy]

    def current() -> str:
        """The worker's "current" cell, once it links both jobs ("" before)."""
        queue_page = web.get(f"/queues/{q.name}").text
        row = queue_page[queue_page.index('data-worker="w-daily"') :]
        cell = row[row.index('data-field="current"') : row.index("</tr>")]
        return cell if all(x in cell for x in links) else ""

    # both jobs it runs at once, each a link to its page (the worker's record says what it
    # runs at its next heartbeat, within a second or so of their start)
    wait_for(current, 10, "both running jobs linked on the queue's page")
    last_job = wait_for(lambda: q.schedules()[0].last_job, 30, "the schedule's first job")
    assert f'href="/queues/{q.name}/jobs/{last_job}"' in web.get(f"/queues/{q.name}").text
