"""A queue's jobs by state, a page at a time, one job in full, and the whole queue's
actions (pause, resume, empty, requeue / delete every dead letter, run a scheduled job now):
``Queue`` and ``AsyncQueue`` (``queueworks.queue.job_lists``, ``queueworks.queue.queue_admin``).

A member is played by hand (as in ``test_unique.py``): what these read and write is
Redis, not timing. One test runs a real worker to show a paused queue's members stop
reading.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis

from queueworks import AsyncClient, Client
from queueworks.protocol.jobrecords import DONE_KEPT, decode_entry
from queueworks.protocol.keys import Keys, TaskKeys
from queueworks.protocol.models import JobState
from queueworks.scripts.bound import JobBatch
from tests.conftest import Cluster, wait_for
from tests.test_unique import MEMBER, Settling

H = "tests.handlers:double"


def read_one(r: redis.Redis, tk: TaskKeys) -> Any:
    """Read the next entry of the queue as a member would: its decoded entry."""
    read: Any = r.xreadgroup(tk.group, MEMBER, {tk.stream: ">"}, count=1)
    entry_id, fields = read[0][1][0]
    return decode_entry(entry_id.decode(), fields)


def settle(client: Client, tk: TaskKeys, entries: list[Any], *, dead: bool = False) -> None:
    """Settle ``entries`` (read by ``read_one``) in one settle call: done, or dead."""
    jobs = [
        Settling(e, time.time(), 1, "boom" if dead else '{"y": 2}', "failed 1 times")
        for e in entries
    ]
    batch = JobBatch(ok=[] if dead else jobs, dead=jobs if dead else [])
    client.scripts.settle_jobs(tk, batch, MEMBER, time.time(), 600, client=None)


def ids(page: Any) -> list[str]:
    return [j.id for j in page.jobs]


@pytest.mark.integration
def test_every_state_is_listed_from_its_index_a_page_at_a_time(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("views")
    tk = keys.task("views")
    now = [q.enqueue(H, {"x": i}) for i in range(8)]
    later = [q.enqueue(H, {"x": i}, delay=600 + i) for i in range(3)]
    waiting = q.enqueue(H, {"x": 99}, depends_on=[now[-1]])
    done = [read_one(r, tk) for _ in range(3)]
    settle(client, tk, done[:2])  # one settle call: both done
    settle(client, tk, [read_one(r, tk)], dead=True)
    # now[2] runs (read by the member), now[3] died, now[4:] wait on the stream

    queued = q.jobs("queued", limit=2, offset=1)
    assert queued.total == 4 and ids(queued) == [now[5].id, now[6].id]
    assert all(j.state == JobState.QUEUED and j.handler == H for j in queued.jobs)
    assert ids(q.jobs("queued", limit=100)) == [j.id for j in now[4:]]
    running = q.jobs("running")
    assert (running.total, ids(running)) == (1, [now[2].id])
    assert running.jobs[0].worker == MEMBER
    scheduled = q.jobs("scheduled", limit=2)
    assert (scheduled.total, ids(scheduled)) == (3, [later[0].id, later[1].id])
    assert scheduled.jobs[0].run_at is not None
    deferred = q.jobs("deferred")
    assert (deferred.total, ids(deferred)) == (1, [waiting.id])
    assert deferred.jobs[0].waits_for == [f"views/{now[-1].id}"]
    finished = q.jobs("done")
    assert (finished.total, ids(finished)) == (2, [now[1].id, now[0].id])  # newest first
    assert r.lrange(tk.done, 0, -1) == [now[1].id.encode(), now[0].id.encode()]
    dead = q.jobs("dead")
    assert (dead.total, ids(dead)) == (1, [now[3].id])
    assert dead.jobs[0].error is not None and "failed 1 times" in dead.jobs[0].error
    assert q.jobs("done", offset=5).jobs == []


@pytest.mark.integration
def test_a_bad_page_is_a_value_error_naming_it(client: Client) -> None:
    q = client.queue("views-bad")
    for kwargs, named in [
        ({"state": "nope"}, "state"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"offset": -1}, "offset"),
    ]:
        with pytest.raises(ValueError, match=named):
            q.jobs(**kwargs)
    assert q.jobs("scheduled", limit=1000, offset=10_000).total == 0  # a zset pages anywhere


@pytest.mark.integration
def test_the_done_index_is_capped_by_one_trim_per_settle(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("views-cap")
    tk = keys.task("views-cap")
    r.rpush(tk.done, *[f"old{i}" for i in range(DONE_KEPT)])
    job = q.enqueue(H, {"x": 1})
    settle(client, tk, [read_one(r, tk)])
    assert r.llen(tk.done) == DONE_KEPT and r.lindex(tk.done, 0) == job.id.encode()


@pytest.mark.integration
def test_a_job_in_full(client: Client, r: redis.Redis, keys: Keys) -> None:
    q = client.queue("views-one")
    tk = keys.task("views-one")
    ok, bad, waits = q.enqueue(H, {"x": 1}), q.enqueue(H, {"x": 2}), q.enqueue(H, {"x": 3})
    assert waits.detail().payload == '{"x":3}' and waits.detail().entry == waits.id
    settle(client, tk, [read_one(r, tk)])
    settle(client, tk, [read_one(r, tk)], dead=True)
    got = ok.detail()
    assert (got.state, got.result, got.traceback) == (JobState.DONE, '{"y": 2}', None)
    died = bad.detail()
    assert died.state == JobState.DEAD and died.traceback == "boom"
    assert died.payload == '{"x":2}'  # from its dead letter
    with pytest.raises(LookupError):
        q.job("f" * 20).detail()


@pytest.mark.integration
def test_a_released_delayed_job_shows_its_payload_while_it_runs(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    """Released, a delayed job's payload leaves its record for its stream entry: its
    detail reads it there, queued and running (a reader once saw none while it ran)."""
    q = client.queue("views-released")
    tk = keys.task("views-released")
    later = q.enqueue(H, {"x": 7}, delay=600)
    assert later.detail().payload == '{"x":7}'
    assert q.run_now(later.id)
    assert later.detail().payload == '{"x":7}' and later.detail().entry != later.id
    read_one(r, tk)
    running = later.detail()
    assert (running.state, running.payload) == (JobState.RUNNING, '{"x":7}')


@pytest.mark.integration
def test_a_requeued_dead_job_keeps_its_own_options(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    """A dead job's options (retries, key, group) stay on its dead letter, and a requeue
    puts them back on its entry: it runs again as it was enqueued, a group's slot and all."""
    q = client.queue("views-opts", group_limit=2)
    tk = keys.task("views-opts")
    job = q.enqueue(H, {"x": 1}, retry_delay=2.0, key="k-1", group="g")
    plain = q.enqueue(H, {"x": 2})
    first, second = read_one(r, tk), read_one(r, tk)
    assert first.options and not second.options
    settle(client, tk, [first, second], dead=True)
    letters = {f[b"job"].decode(): f for _, f in r.xrange(tk.dead)}
    assert letters[job.id][b"o"].decode() == first.options and b"o" not in letters[plain.id]
    assert q.requeue_dead() == 2
    again = {e.job_id: e for e in (read_one(r, tk), read_one(r, tk))}
    assert again[job.id].options == first.options and not again[plain.id].options


@pytest.mark.integration
def test_the_queue_actions(client: Client, r: redis.Redis, keys: Keys) -> None:
    q = client.queue("views-act")
    tk = keys.task("views-act")
    held = q.enqueue(H, {"x": 0}, key="k1")
    read_one(r, tk)  # runs: empty leaves it
    backlog = [q.enqueue(H, {"x": i}, key=f"b{i}") for i in range(150)]
    dependent = q.enqueue(H, {"x": 1}, depends_on=[backlog[0]])
    later = q.enqueue(H, {"x": 1}, delay=600)

    assert q.empty() == 150
    assert q.status().backlog == 0 and q.jobs("running").total == 1
    assert backlog[7].status().state == JobState.CANCELLED
    assert dependent.status().state == JobState.DEAD  # what waited for it died with it
    assert q.enqueue(H, {"x": 1}, key="b7").created  # its unique key is free again
    assert q.enqueue(H, {"x": 1}, key="k1").id == held.id  # the running one keeps its own
    kinds = [f[b"kind"] for _, f in r.xrange(keys.events)]
    assert b"emptied" in kinds

    assert q.run_now(later.id) and later.status().state == JobState.QUEUED
    assert not q.run_now(later.id)  # not scheduled any more

    for _ in range(2):  # b7's new job, then the one run now
        settle(client, tk, [read_one(r, tk)], dead=True)
    assert q.status().dead == 3  # the dependent, and these two
    assert q.requeue_dead() == 3 and q.status().dead == 0
    assert q.jobs("dead").total == 0 and q.jobs("queued").total == 3
    settle(client, tk, [read_one(r, tk)], dead=True)
    assert q.delete_dead() == 1 and q.status().dead == 1  # still counted: only the letters go

    assert q.pause() and not q.pause() and q.status().paused
    assert q.resume() and not q.resume() and not q.status().paused
    with pytest.raises(ValueError, match="job id"):
        q.run_now("{x}")


@pytest.mark.integration
def test_the_asyncio_queue_does_the_same(redis_url: str, prefix: str) -> None:
    async def go() -> None:
        client = AsyncClient.from_url(redis_url, prefix=prefix)
        try:
            q = await client.queue("views-aio")
            job = await q.enqueue(H, {"x": 1})
            page = await q.jobs("queued")
            assert (page.total, ids(page)) == (1, [job.id])
            assert (await job.detail()).payload == '{"x":1}'
            assert await q.pause() and (await q.status()).paused and await q.resume()
            assert await q.empty() == 1
            assert await q.requeue_dead() == 0 and await q.delete_dead() == 0
            assert not await q.run_now(job.id)
        finally:
            await client.close()

    asyncio.run(go())


@pytest.mark.system
def test_a_paused_queues_members_stop_reading(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker()
    q = client.queue("views-pause")
    assert q.enqueue(H, {"x": 1}).result(timeout=60) == 2
    q.pause()
    time.sleep(1.0)  # a check (every 50 ms) rides a read (<= 100 ms): the next read sees it
    job = q.enqueue(H, {"x": 2})
    time.sleep(1.0)  # what must NOT happen has a second to happen
    assert job.status().state == JobState.QUEUED and q.status().nodes  # still a member
    q.resume()
    assert job.result(timeout=30) == 4
    wait_for(lambda: q.status().backlog == 0, 10, "the backlog read")


# -- the dashboard and the command line --------------------------------------------------


@pytest.mark.integration
def test_the_dashboard_lists_jobs_shows_one_and_finds_it(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    from tests.test_dashboard import make_app

    q = client.queue("dash-jobs")
    tk = keys.task("dash-jobs")
    jobs = [q.enqueue(H, {"x": i}) for i in range(3)]
    later = q.enqueue(H, {"x": 9}, delay=600)
    settle(client, tk, [read_one(r, tk)])
    with make_app(client) as web:
        page = web.get("/api/queues/dash-jobs/jobs", params={"state": "queued", "limit": 1})
        assert page.status_code == 200
        body = page.json()
        assert (body["total"], [j["id"] for j in body["jobs"]]) == (2, [jobs[1].id])
        done = web.get("/api/queues/dash-jobs/jobs", params={"state": "done"}).json()
        assert [j["id"] for j in done["jobs"]] == [jobs[0].id]
        one = web.get(f"/api/queues/dash-jobs/jobs/{jobs[0].id}").json()
        assert (one["state"], one["result"]) == ("done", '{"y": 2}')
        for bad in ({"state": "nope"}, {"limit": "0"}, {"offset": "x"}):
            got = web.get("/api/queues/dash-jobs/jobs", params=bad)
            assert got.status_code == 400 and got.json()["ok"] is False
        assert web.get("/api/queues/nope/jobs").status_code == 404
        assert web.get("/api/queues/dash-jobs/jobs/ffff").status_code == 404

        html = web.get("/queues/dash-jobs", params={"jobs": "scheduled"}).text
        assert f"/queues/dash-jobs/jobs/{later.id}" in html and "Run now" in html
        assert web.get(f"/queues/dash-jobs/jobs/{jobs[1].id}").status_code == 200
        found = web.get("/search", params={"q": jobs[2].id}, follow_redirects=False)
        assert found.headers["location"] == f"/queues/dash-jobs/jobs/{jobs[2].id}"
        assert web.get("/search", params={"q": "dash-jobs"}, follow_redirects=True).url.path == (
            "/queues/dash-jobs"
        )
        assert web.get("/search", params={"q": "<b>nothing"}).status_code == 404
        named = web.get("/search", params={"q": f"dash-jobs/{jobs[2].id}"}, follow_redirects=False)
        assert named.headers["location"] == f"/queues/dash-jobs/jobs/{jobs[2].id}"
        for nothing in ("dash-jobs/anything", "dash-jobs/1-0", "dash-jobs/", "dash-jobs/a/b"):
            got = web.get("/search", params={"q": nothing}, follow_redirects=False)
            assert got.status_code == 404 and "location" not in got.headers, (nothing, got)


@pytest.mark.integration
def test_the_dashboard_actions_on_a_whole_queue(client: Client, r: redis.Redis, keys: Keys) -> None:
    from tests.test_dashboard import make_app, post

    q = client.queue("dash-act")
    tk = keys.task("dash-act")
    q.enqueue(H, {"x": 1})
    settle(client, tk, [read_one(r, tk)], dead=True)
    later = q.enqueue(H, {"x": 2}, delay=600)
    [q.enqueue(H, {"x": i}) for i in range(3)]
    with make_app(client) as web:
        assert web.post("/api/queues/dash-act/pause").status_code == 403  # no CSRF token
        got = post(web, "/api/queues/dash-act/pause").json()
        assert got["ok"] and q.status().paused
        assert post(web, "/api/queues/dash-act/resume").json()["changed"] is True
        assert post(web, "/api/queues/dash-act/empty").json()["cancelled"] == 3
        assert post(web, f"/api/queues/dash-act/jobs/{later.id}/run").json()["ok"]
        again = post(web, f"/api/queues/dash-act/jobs/{later.id}/run")
        assert again.status_code == 400 and "not scheduled" in again.json()["error"]
        assert post(web, "/api/queues/dash-act/dead/requeue-all").json()["requeued"] == 1
        settle(client, tk, [read_one(r, tk)], dead=True)
        assert post(web, "/api/queues/dash-act/dead/delete-all").json()["deleted"] == 1
        assert post(web, "/api/queues/dash-act/explode").status_code == 404
        assert post(web, "/api/queues/nope/pause").status_code == 404
        form = post(web, "/queues/dash-act/pause", {"next": "/queues/dash-act"})
        assert form.status_code == 303 and q.status().paused


@pytest.mark.integration
def test_a_live_update_sends_only_the_blocks_that_changed(client: Client) -> None:
    from tests.test_dashboard import make_app

    q = client.queue("dash-live")
    with make_app(client) as web:
        first = web.get("/queues/dash-live", headers={"X-Live": "-"}).json()
        assert "queue-dead" in first["blocks"] and set(first["blocks"]) == set(first["hashes"])
        have = ";".join(f"{k}={v}" for k, v in first["hashes"].items())
        q.enqueue(H, {"x": 1})
        second = web.get("/queues/dash-live", headers={"X-Live": have}).json()
        assert "queue-jobs" in second["blocks"] and "queue-dead" not in second["blocks"]
        full = web.get("/queues/dash-live").text
        assert len(json_size(second)) < len(full)


def json_size(answer: dict[str, Any]) -> str:
    return json.dumps(answer)


def json_loads(text: str) -> Any:
    return json.loads(text)


@pytest.mark.integration
def test_the_queue_command(redis_url: str, prefix: str, client: Client) -> None:
    from tests.test_cli import cli, one_line_error

    q = client.queue("cli-q")
    job = q.enqueue(H, {"x": 1})
    later = q.enqueue(H, {"x": 1}, delay=600)
    listed = cli(["queue", "cli-q", "jobs", "--json"], redis_url, prefix)
    assert listed.returncode == 0, listed.stderr
    assert [j["id"] for j in json_loads(listed.stdout)["jobs"]] == [job.id]
    assert "queue cli-q paused" in cli(["queue", "cli-q", "pause"], redis_url, prefix).stdout
    assert q.status().paused
    assert cli(["queue", "cli-q", "resume"], redis_url, prefix).returncode == 0
    assert "1 job(s)" in cli(["queue", "cli-q", "empty"], redis_url, prefix).stdout
    assert cli(["queue", "cli-q", "run", later.id], redis_url, prefix).returncode == 0
    one_line_error(cli(["queue", "cli-q", "run", later.id], redis_url, prefix), 1, "not scheduled")
    one_line_error(cli(["queue", "cli-q", "jobs", "--state", "x"], redis_url, prefix), 2, "state")
    one_line_error(cli(["queue", "nope", "pause"], redis_url, prefix), 1, "no queue nope")
    assert "0 dead" in cli(["queue", "cli-q", "requeue-dead"], redis_url, prefix).stdout
    assert "0 dead letter" in cli(["queue", "cli-q", "delete-dead"], redis_url, prefix).stdout


@pytest.mark.integration
def test_a_queue_summary_bounds_its_dead_letters_payloads(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    """Five dead jobs of 1 MB payloads: ``GET /api/queues/{name}`` (and its page) say how
    big each payload is and show its start; the job's own page has it in full."""
    from tests.test_dashboard import make_app

    q = client.queue("dash-big")
    tk = keys.task("dash-big")
    blob = "x" * 1_000_000
    jobs = [q.enqueue(H, {"blob": blob, "i": i}) for i in range(5)]
    settle(client, tk, [read_one(r, tk) for _ in jobs], dead=True)
    with make_app(client) as web:
        got = web.get("/api/queues/dash-big")
        assert got.status_code == 200 and len(got.content) < 100_000, len(got.content)
        letters = got.json()["dead_letters"]
        assert len(letters) == 5
        for letter in letters:
            assert letter["payload_bytes"] == len('{"blob":"",}') + len(blob) + len('"i":0')
            assert letter["payload"].startswith('{"blob":"xxx') and len(letter["payload"]) == 2000
            assert letter["payload_cut"] is True
        page = web.get("/queues/dash-big")
        assert len(page.content) < 200_000 and "bytes: the job's page has it all" in page.text
        full = web.get(f"/api/queues/dash-big/jobs/{jobs[0].id}").json()
        assert json.loads(full["payload"])["blob"] == blob


@pytest.mark.integration
def test_dead_jobs_whose_letters_are_gone_are_counted_apart(
    client: Client, r: redis.Redis, keys: Keys, redis_url: str, prefix: str
) -> None:
    """The dead-letter stream keeps the newest letters only: jobs counted dead beyond what
    it keeps are shown as such, and requeue-all says it could not reach them."""
    from tests.test_dashboard import make_app, post

    q = client.queue("dash-cap")
    tk = keys.task("dash-cap")
    jobs = [q.enqueue(H, {"x": i}) for i in range(3)]
    settle(client, tk, [read_one(r, tk) for _ in jobs], dead=True)
    r.xtrim(tk.dead, maxlen=1, approximate=False)  # as the stream's cap trims the oldest
    with make_app(client) as web:
        body = web.get("/api/queues/dash-cap").json()
        assert (body["queue"]["dead"], body["dead_letters_total"]) == (3, 1)
        assert body["dead_without_letter"] == 2
        assert "2 dead job(s) have no dead letter kept" in web.get("/queues/dash-cap").text
        got = post(web, "/api/queues/dash-cap/dead/requeue-all").json()
        assert (got["requeued"], got["dead_without_letter"]) == (1, 2), got
        assert "2 job(s) counted dead have no dead letter kept" in got["message"], got
    from tests.test_cli import cli

    said = cli(["queue", "dash-cap", "requeue-dead"], redis_url, prefix)
    assert said.returncode == 0, said.stderr
    assert "0 dead job(s) requeued; 2 job(s) counted dead have no dead letter" in said.stdout
