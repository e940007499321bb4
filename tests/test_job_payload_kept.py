"""A job keeps its payload for as long as its record lives: a done job's too (up to
``DONE_PAYLOAD_KEPT`` bytes), written by the settle from the payload the worker holds. The
job page shows it, a typed job's arguments by parameter name (the handler's signature,
where the dashboard may import it: ``allow``), and the workers page every job a worker runs
at once, each a link.

Real Redis, real worker processes; the dashboard in-process (``make_app``).
"""

from __future__ import annotations

import json

import pytest

from queueworks import Client
from queueworks.protocol.jobrecords import DONE_PAYLOAD_KEPT
from queueworks.protocol.models import JobState
from tests import handlers_typed
from tests.conftest import Cluster, wait_for
from tests.test_dashboard import make_app

ALLOW = ("tests.handlers", "tests.handlers_typed")


@pytest.mark.system
def test_a_done_job_keeps_its_payload_and_its_page_names_the_arguments(
    cluster: Cluster, client: Client
) -> None:
    q = client.queue("kept-payload")
    plain = q.enqueue("tests.handlers:double", {"x": 21})
    typed = q.enqueue(handlers_typed.add.call(2, 3, note="n"))
    # by position, as a producer in another language may send it
    positional = q.enqueue("tests.handlers_typed:add", {"args": [4, 5], "kwargs": {}})
    later = q.enqueue("tests.handlers:double", {"x": 7}, delay=0.2)  # named: a record at once
    big = q.enqueue("tests.handlers:double", {"x": 1, "pad": "p" * DONE_PAYLOAD_KEPT})
    cluster.worker("w-kept", allow=ALLOW)
    assert plain.result(timeout=60) == 42 and typed.result(timeout=60) == 6
    assert positional.result(timeout=60) == 9 and later.result(timeout=60) == 14
    assert big.result(timeout=60) == 2

    assert json.loads(plain.detail().payload or "null") == {"x": 21}
    assert json.loads(later.detail().payload or "null") == {"x": 7}
    kwargs = {"a": 2, "b": 3, "note": "n"}
    assert json.loads(typed.detail().payload or "null") == {"args": [], "kwargs": kwargs}
    assert big.detail().payload is None  # over the bound: not kept once done
    with make_app(client, allow=("tests.handlers_typed",)) as web:
        got = web.get(f"/api/queues/{q.name}/jobs/{plain.id}").json()
        assert got["state"] == "done" and json.loads(got["payload"]) == {"x": 21}
        page = web.get(f"/queues/{q.name}/jobs/{positional.id}").text
        at = page.index('id="job-arguments"')
        table = page[at : page.index("</table>", at)]
        assert "<th>a</th><td><code>4</code>" in table and "<th>b</th><td><code>5</code>" in table
        assert "#0" not in table
        page = web.get(f"/queues/{q.name}/jobs/{big.id}").text
        assert 'id="job-no-payload"' in page
        assert "Not kept: a done job keeps a payload of at most 65,536 characters" in page
    with make_app(client) as web:  # no allow: nothing imported, positions as given
        page = web.get(f"/queues/{q.name}/jobs/{positional.id}").text
        assert "<th>#0</th><td><code>4</code>" in page


@pytest.mark.system
def test_a_worker_shows_every_job_it_runs_and_each_node_set_only_its_own(
    cluster: Cluster, client: Client
) -> None:
    q, other = client.queue("kept-busy"), client.queue("kept-other")
    busy = [q.enqueue("tests.handlers:sleep_for", {"seconds": 60.0}) for _ in range(3)]
    elsewhere = other.enqueue("tests.handlers:sleep_for", {"seconds": 60.0})
    cluster.worker("w-busy", extra=["--concurrency", "4"])
    running = [*busy, elsewhere]
    wait_for(lambda: all(b.status().state == JobState.RUNNING for b in running), 60, "running")
    with make_app(client) as web:

        def cell() -> str:
            page = web.get("/workers").text
            row = page[page.index('data-worker="w-busy"') :]
            return row[row.index('data-field="current"') : row.index("</tr>")]

        wait_for(lambda: all(b.id in cell() for b in busy), 30, "every job in the row")
        for b in busy:
            assert f'<a href="/queues/{q.name}/jobs/{b.id}"><code>{b.id}</code></a>' in cell()
        api = web.get("/api/workers").json()["workers"]
        (w,) = [w for w in api if w["id"] == "w-busy"]
        assert sorted(w["jobs"]) == sorted(
            [f"{q.name}/{b.id}" for b in busy] + [f"{other.name}/{elsewhere.id}"]
        )
    # each queue's node set: what the worker runs of that queue, never another's job
    (node,) = q.status().nodes
    assert node.worker == "w-busy" and node.current in {b.id for b in busy}
    (node,) = other.status().nodes
    assert node.worker == "w-busy" and node.current == elsewhere.id
