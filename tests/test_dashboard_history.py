"""Settled and dead per minute kept in Redis (``dashboard.history``): written once a minute
by a dashboard that watched it whole, the same for every dashboard process (the first
writer's count kept), read back after a restart, a day kept.

Real Redis; throughput samples taken at chosen times against real task records.
"""

from __future__ import annotations

import time

import pytest
import redis

from queueworks import Client, TaskSpec
from queueworks.dashboard import history
from queueworks.dashboard.throughput import Throughput
from queueworks.protocol.keys import Keys
from tests.test_dashboard import make_app


def at(minute: int, second: float) -> float:
    return minute * 60 + second


@pytest.mark.integration
def test_a_minute_watched_whole_is_kept_in_redis_for_every_dashboard(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    task = client.submit(
        TaskSpec(name="h", handler="tests.handlers:double", subtasks=[{"x": 1}] * 90)
    )
    rec = keys.task(task.id).record
    one, other = Throughput(), Throughput()  # two dashboard processes
    one.sample(r, keys, now=at(16667, 20))  # started within minute 16667: it is not watched whole
    r.hincrby(rec, "done", 4)
    one.sample(r, keys, now=at(16667, 50))
    other.sample(r, keys, now=at(16667, 55))
    r.hincrby(rec, "done", 10)
    r.hincrby(rec, "dead", 3)
    one.sample(r, keys, now=at(16668, 10))  # minute 16668: watched whole from its start
    other.sample(r, keys, now=at(16668, 12))
    r.hincrby(rec, "done", 7)
    one.sample(r, keys, now=at(16668, 40))
    other.sample(r, keys, now=at(16668, 41))
    one.sample(r, keys, now=at(16669, 5))  # minute 16669: 16668 is over and written
    other.sample(r, keys, now=at(16669, 6))  # the same minute: the first writer's is kept

    minutes = history.read(r, keys, now=at(16669, 5), count=3)  # 16666, 16667, 16668
    assert [m.at for m in minutes] == [16666 * 60, 16667 * 60, 16668 * 60]
    assert minutes[0].settled is None and minutes[1].settled is None  # nobody watched
    assert minutes[2] == history.Minute(16668 * 60, 20, 3)
    assert r.hlen(keys.throughput_minutes) == 1

    fresh = Throughput()  # a restart: the history is Redis's, not the process's
    fresh.sample(r, keys, now=at(16669, 15))
    assert history.read(r, keys, now=at(16669, 15), count=1) == [minutes[2]]


@pytest.mark.integration
def test_a_day_is_kept_and_the_api_and_overview_show_it(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    old = 16668 - history.KEPT - 5
    r.hset(keys.throughput_minutes, mapping={str(old): "9 9", "junk": "x", "16669": "1 0"})
    history.write(r, keys, 16670, 6, 2)  # a multiple of PRUNE_EVERY: the old ones go
    assert {f.decode() for f in r.hkeys(keys.throughput_minutes)} == {"16669", "16670"}
    now = 16671 * 60 + 5.0
    assert [m.settled for m in history.read(r, keys, now, count=2)] == [1, 6]

    minute = int(time.time() // 60) - 1
    r.hset(keys.throughput_minutes, str(minute), "42 5")
    with make_app(client) as web:
        got = web.get("/api/history?minutes=2").json()["minutes"]
        assert got[-1] == {"at": minute * 60, "settled": 42, "dead": 5}
        assert len(got) == 2
        assert web.get("/api/overview").json()["history"][-1]["settled"] == 42
        page = web.get("/").text
        assert 'id="history"' in page and "42 settled, 5 dead" in page
        bad = web.get("/api/history?minutes=0")
        assert bad.status_code == 400 and "minutes" in bad.json()["error"]
