"""Finding jobs on the dashboard: ``/api/queues/{q}/jobs?state=&q=`` (an id prefix, the
handler, the error text), paging that reaches every job of a state (past 10,000, a page
size, first / last), bad parameters a 400 saying why (API and page), and the header's
search finding tasks and queues by name.

Real Redis, a real worker process; the dashboard in-process (``make_app``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from queueworks import Client, TaskSpec
from tests.conftest import Cluster, wait_for
from tests.test_dashboard import make_app


@pytest.fixture
def web(client: Client) -> Iterator[httpx.Client]:
    with make_app(client) as http:
        yield http


def ids(web: httpx.Client, path: str) -> list[str]:
    got = web.get(path)
    assert got.status_code == 200, got.text
    return [j["id"] for j in got.json()["jobs"]]


@pytest.mark.integration
def test_a_text_finds_jobs_by_id_prefix_and_handler(client: Client, web: httpx.Client) -> None:
    q = client.queue("find-h")
    doubles = [q.enqueue("tests.handlers:double", {"x": i}, delay=600) for i in range(3)]
    squares = [q.enqueue("tests.handlers:square", {"x": i}, delay=600) for i in range(2)]
    base = f"/api/queues/{q.name}/jobs?state=scheduled"
    assert set(ids(web, base + "&q=SQUARE")) == {j.id for j in squares}
    assert ids(web, base + f"&q={doubles[1].id[:12]}") == [doubles[1].id]
    body = web.get(base + "&q=handlers&limit=2&offset=2").json()
    assert body["total"] == 5 and len(body["jobs"]) == 2 and body["complete"] is True
    assert web.get(base + "&q=nothing-has-this").json()["total"] == 0
    page = web.get(f"/queues/{q.name}?jobs=scheduled&jobs_q=square").text
    assert "2 shown of 2 scheduled matching <code>square</code>" in page
    assert all(j.id in page for j in squares) and doubles[0].id not in page


@pytest.mark.integration
def test_paging_reaches_every_job_past_ten_thousand(client: Client, web: httpx.Client) -> None:
    q = client.queue("many-h")
    jobs = q.enqueue_many([("tests.handlers:double", {"x": i}) for i in range(10_030)])
    base = f"/api/queues/{q.name}/jobs?state=queued"
    assert ids(web, base + "&offset=10020&limit=20") == [j.id for j in jobs[10_020:]]
    assert ids(web, base + "&offset=9990&limit=20") == [j.id for j in jobs[9_990:10_010]]
    assert ids(web, base + "&offset=0&limit=3") == [j.id for j in jobs[:3]]
    assert ids(web, base + "&offset=10030&limit=20") == []
    page = web.get(f"/queues/{q.name}?jobs=queued&jobs_limit=50").text
    last = re.search(r'href="([^"]+)" data-page="last"', page)
    assert last and "jobs_offset=10000" in last.group(1) and "jobs_limit=50" in last.group(1)
    end = web.get(last.group(1).replace("&amp;", "&")).text
    assert jobs[-1].id in end and "page 201 of 201" in end and 'data-page="first"' in end


@pytest.mark.integration
def test_bad_parameters_are_a_400_that_says_why(client: Client, web: httpx.Client) -> None:
    q = client.queue("bad-h")
    api = f"/api/queues/{q.name}/jobs"
    for query, named in [
        ("?limit=abc", "limit"),
        ("?limit=0", "limit"),
        ("?offset=-1", "offset"),
        ("?state=nope", "state"),
        ("?q=", "q must be"),
    ]:
        got = web.get(api + query)
        assert got.status_code == 400 and named in got.json()["error"], (query, got.text)
    for query, named in [
        ("?jobs_offset=abc", "jobs_offset must be an integer"),
        ("?jobs_limit=5000", "jobs_limit must be from 1 to 1000"),
        ("?jobs=nope", "jobs must be one of"),
    ]:
        got = web.get(f"/queues/{q.name}{query}")
        assert got.status_code == 400 and named in got.text, query


@pytest.mark.system
def test_error_text_finds_dead_jobs_and_the_oldest_page_is_read_from_its_end(
    cluster: Cluster, client: Client, web: httpx.Client
) -> None:
    q = client.queue("err-h", max_attempts=1)
    jobs = [q.enqueue("tests.handlers:fail_odd", {"x": i}) for i in range(8)]
    cluster.worker("w-err")
    wait_for(lambda: all(j.status().state.finished for j in jobs), 60, "every job finished")
    base = f"/api/queues/{q.name}/jobs?state=dead"
    odd = {j.id for j in jobs[1::2]}
    assert set(ids(web, base + "&q=ValueError:%20odd")) == odd
    newest_first = ids(web, base + "&limit=100")
    assert set(newest_first) == odd
    paged = [i for at in range(0, 4) for i in ids(web, base + f"&limit=1&offset={at}")]
    assert paged == newest_first
    assert ids(web, base + "&limit=3&offset=2") == newest_first[2:]
    assert ids(web, base + "&limit=5&offset=4") == []  # past the end: none, not the oldest


@pytest.mark.integration
def test_the_header_search_finds_tasks_and_queues_by_name(
    client: Client, web: httpx.Client
) -> None:
    task = client.submit(
        TaskSpec(name="nightly-report", handler="tests.handlers:double", subtasks=[{"x": 1}])
    )
    client.queue("mailers-outbound")
    client.queue("mailers-inbound")
    got = web.get("/search?q=NIGHTLY", follow_redirects=False)
    assert got.status_code == 303 and got.headers["location"] == f"/tasks/{task.id}"
    got = web.get("/search?q=outbound", follow_redirects=False)
    assert got.status_code == 303 and got.headers["location"] == "/queues/mailers-outbound"
    page = web.get("/search?q=mailers")
    assert page.status_code == 200
    assert 'href="/queues/mailers-outbound"' in page.text
    assert 'href="/queues/mailers-inbound"' in page.text
    assert web.get("/search?q=no-such-name").status_code == 404
